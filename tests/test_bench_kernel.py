"""experiments/bench_kernel.py's variant syntax, pair count and point inputs (the script itself
runs on the GPU machine)."""

import argparse
import json
import types

import numpy as np
import pytest

from experiments import bench_kernel
from experiments.bench_kernel import (add_point_args, attended_pairs, parse_variant,
                                      point_inputs, r_squared, variant_tag)
from pallas_kernels.moba import MobaBlockSizes


def test_variant_fields():
  bs = parse_variant("64,32,128,4,3")
  assert (bs.block_rows, bs.block_k, bs.block_k_dkv, bs.num_warps, bs.num_stages) == (
      64, 32, 128, 4, 3)
  assert (bs.num_warps_bwd, bs.num_stages_bwd) == (4, 3)  # the backward follows the forward
  assert bs.skip_full_masks is None  # decided by head_dim
  assert parse_variant("64,64,64,4,2,1").skip_full_masks is True
  assert parse_variant("64,64,64,4,2,0").skip_full_masks is False
  assert parse_variant("64,64,64,4,2,a").skip_full_masks is None
  bs = parse_variant("64,64,64,4,2,0,8,1")
  assert (bs.num_warps, bs.num_stages, bs.num_warps_bwd, bs.num_stages_bwd) == (4, 2, 8, 1)
  assert bs.fast_exp2 and not parse_variant("64,64,64,4,2,0,4,2,0").fast_exp2


@pytest.mark.parametrize("text", ["a,64,64,4,2", "64,64,64,4,2,2", "64,64,64,4,2,1,a,2",
                                  "64,64,64,4", "64,64,64,4,2,1,8",
                                  "64,64,64,4,2,1,4,2,a", "64,64,64,4,2,1,4,2,1,1"])
def test_bad_variants_are_refused(text):
  with pytest.raises(ValueError, match="variant"):
    parse_variant(text)


def test_tag_names_the_decided_variant():
  auto = parse_variant("64,64,64,4,2")
  assert variant_tag(auto.fit(256, 64)) == "r64_k64_kd64_w4_s2_skipfull"
  assert variant_tag(auto.fit(512, 128)) == "r64_k64_kd64_w4_s2"
  assert variant_tag(MobaBlockSizes(num_warps_bwd=8, num_stages_bwd=1).fit(512, 128)) == (
      "r64_k64_kd64_w4_s2_bw8_bs1")
  assert variant_tag(parse_variant("64,64,64,4,2,0,4,2,0").fit(512, 128)) == (
      "r64_k64_kd64_w4_s2_libexp2")


def test_attended_pairs_sum_over_rows():
  """Two rows of 8 tokens, blocks of 4: row 0 attends its own blocks only, row 1's second
  block also one earlier block - counted by hand, per query head, times the group."""
  count_BTG = np.ones((2, 8, 1), np.int32)
  count_BTG[1, 4:] = 2
  sel = types.SimpleNamespace(count_BTG=count_BTG)
  own = 2 * (1 + 2 + 3 + 4)  # causal within each block, per row
  assert attended_pairs(sel, block=4, group=1) == 2 * own + 4 * 4
  assert attended_pairs(sel, block=4, group=7) == 7 * (2 * own + 4 * 4)


def test_point_inputs_take_the_batch():
  p = argparse.ArgumentParser()
  add_point_args(p)
  args = p.parse_args(["--seq", "256", "--heads", "tiny", "--k", "2", "--batch", "3"])
  d, q, k, v, do, seg, budget = point_inputs(args)
  assert q.shape == (3, 256, 2, 16) and k.shape == (3, 256, 1, 16) and seg.shape == (3, 256)
  assert budget.tolist() == [2, 2, 2]
  with pytest.raises(ValueError, match="--batch"):
    point_inputs(p.parse_args(["--batch", "0"]))


def _fake_clocks(monkeypatch, sync_ms, pipe_ms, span_ms):
  """bench_kernel's three clocks replaced by fixed readings (ms), the synchronised one by
  sync_ms(*operands) of the call it times (the calls are then never run)."""
  monkeypatch.setattr(bench_kernel, "INTERPRET", True)
  monkeypatch.setattr(bench_kernel, "timeit", lambda fn, *args, reps: sync_ms(*args))
  monkeypatch.setattr(bench_kernel, "timeit_pipelined", lambda fn, *args: pipe_ms)
  monkeypatch.setattr(bench_kernel, "device_span", lambda fn, *args, reps: span_ms)
  return bench_kernel


def test_rates_and_ratios_count_useful_pairs_per_clock(monkeypatch):
  """bench_cudnn and bench_moba's rates from fixed readings, against pairs counted by hand:
  two rows of 128 tokens (blocks of 32), 4 query heads over 2 KV heads, head_dim 16. cuDNN
  counts T(T+1)/2 pairs per head and row; MoBA at budget 4 (every block) attends exactly those,
  at budget 1 its own block causally, at budget 2 also one earlier block (none before block
  0). Forward 4 * D per pair, forward+backward 3.5x that; each ratio to cuDNN takes the same
  clock's reading on both sides."""
  b, t, block, hq, hkv, d = 2, 128, 32, 4, 2, 16
  bk = _fake_clocks(monkeypatch, lambda *args: {3: 2.0, 4: 5.0}[len(args)], pipe_ms=4.0,
                    span_ms=3.0)
  c = bk.bench_cudnn(t, hq, hkv, d, reps=1, batch=b)
  dense = b * hq * t * (t + 1) // 2
  assert dense == 2 * 4 * 8256
  flops = 4 * d * dense
  assert c["fwd_tflops"] == pytest.approx(flops / 2e-3 / 1e12, rel=1e-12)
  assert c["fwdbwd_tflops"] == pytest.approx(3.5 * flops / 5e-3 / 1e12, rel=1e-12)
  assert c["fwdbwd_pipe_tflops"] == pytest.approx(3.5 * flops / 4e-3 / 1e12, rel=1e-12)
  assert c["fwdbwd_span_tflops"] == pytest.approx(3.5 * flops / 3e-3 / 1e12, rel=1e-12)
  # MoBA: forward 1 ms (4 operands with the budget), forward+backward 2 ms (5), gate 0.1 (3).
  bk = _fake_clocks(monkeypatch, lambda *args: {4: 1.0, 5: 2.0, 3: 0.1}[len(args)],
                    pipe_ms=1.0, span_ms=2.0)
  rows = bk.bench_moba(t, block, [4, 1, 2], 4, hq, hkv, d, bk.MobaBlockSizes(), reps=1, batch=b)
  own = block * (block + 1) // 2  # 528: a block's causal pairs with itself
  pairs = {4: dense, 1: b * hq * 4 * own, 2: b * hq * (own + 3 * (block * block + own))}
  assert pairs[2] == 2 * 4 * 5184
  for row in rows:
    moba_flops = 4 * d * pairs[row["k"]]
    assert row["fwd_tflops"] == pytest.approx(moba_flops / 1e-3 / 1e12, rel=1e-12)
    assert row["fwdbwd_tflops"] == pytest.approx(3.5 * moba_flops / 2e-3 / 1e12, rel=1e-12)
    assert row["fwdbwd_pipe_tflops"] == pytest.approx(3.5 * moba_flops / 1e-3 / 1e12, rel=1e-12)
    assert row["fwdbwd_span_tflops"] == pytest.approx(3.5 * moba_flops / 2e-3 / 1e12, rel=1e-12)
    assert row["gate_ms"] == 0.1
    bk.with_ratios(row, c)
    share = pairs[row["k"]] / dense  # the useful work relative to cuDNN's
    for key, moba_ms, cudnn_ms in (("fwd", 1.0, 2.0), ("fwdbwd", 2.0, 5.0),
                                   ("fwdbwd_pipe", 1.0, 4.0), ("fwdbwd_span", 2.0, 3.0)):
      assert row[f"ratio_{key}"] == pytest.approx(share * cudnn_ms / moba_ms, rel=1e-12), key


def test_r_squared_by_hand():
  """y = 1, 3, 2 over x = 2, 3, 4: least squares 0.5 x + 0, residuals -0.5, 1, -0.5, so
  SS_res 1.5 against SS_tot 2 about y's mean: R^2 = 0.25. A line fits exactly; scaling y or
  shifting x changes nothing."""
  assert r_squared([2, 3, 4], [1, 3, 2]) == pytest.approx(0.25, rel=1e-12)
  assert r_squared([2, 3, 4], [10, 30, 20]) == pytest.approx(0.25, rel=1e-12)
  assert r_squared([102, 103, 104], [1, 3, 2]) == pytest.approx(0.25, rel=1e-12)
  rng = np.random.default_rng()
  x = np.arange(2, 9)
  assert r_squared(x, 0.3 + rng.uniform(0.1, 2.0) * x) == pytest.approx(1.0, abs=1e-12)


def test_main_fits_the_sweep_over_every_budget(tmp_path, monkeypatch):
  """main() with fixed readings (nothing is timed): the budget sweep at k_max 4 runs k = 2, 3,
  4 and fits each clock's times against k. Forward times k^2 ms: least squares 6k - 25/3,
  residuals 1/3, -2/3, 1/3 against deviations -17/3, -2/3, 19/3 about the mean 29/3, so
  R^2 = 1 - 6/654; forward+backward 2k + 1 ms, a line: R^2 = 1. Every sweep row carries its
  ratios to the run's cuDNN row."""

  def sync(*args):
    budget = args[-1]
    if len(args) >= 4 and np.asarray(budget).dtype == np.int32:  # a MoBA call: (..., budget)
      k = int(np.asarray(budget)[0])
      return {4: k * k, 5: 2 * k + 1}[len(args)]
    return {1: 0.01, 3: 3.0, 4: 7.0}[len(args)]  # the floor; cuDNN forward, forward+backward

  _fake_clocks(monkeypatch, sync, pipe_ms=2.0, span_ms=1.5)
  out = tmp_path / "bench.json"
  monkeypatch.setattr("sys.argv", ["bench_kernel", "--skip-check", "--interpret", "--heads",
                                   "tiny", "--seqs", "256", "--blocks", "64", "--ks", "2",
                                   "--sweep", "4", "--reps", "1", "--out", str(out)])
  bench_kernel.main()
  rows = json.loads(out.read_text())["rows"]
  sweep = [r for r in rows if r["kind"] == "sweep"]
  assert [r["k"] for r in sweep] == [2, 3, 4] and {r["k_max"] for r in sweep} == {4}
  cudnn = next(r for r in rows if r["kind"] == "cudnn")
  for r in sweep:
    assert r["ratio_fwd"] == pytest.approx(r["fwd_tflops"] / cudnn["fwd_tflops"], rel=1e-12)
    assert r["ratio_fwdbwd_span"] == pytest.approx(
        r["fwdbwd_span_tflops"] / cudnn["fwdbwd_span_tflops"], rel=1e-12)
  (fit,) = [r for r in rows if r["kind"] == "fit"]
  assert fit["r2_fwd"] == pytest.approx(1 - 6 / 654, rel=1e-12)
  assert fit["r2_fwdbwd"] == pytest.approx(1.0, abs=1e-12)
