"""experiments/tensor_work.py: the Hopper kernels' tensor-core work, counted from their item
plans, against a count made by hand for a selection whose plans are known in closed form; a
trace of another point refused."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import tensor_work
from experiments.h200.trace_table import kernel_times
from experiments.tensor_work import kernel_work
from pallas_kernels.moba import moba_gate


@pytest.mark.parametrize("d", [64, 128])
def test_kernel_work_every_eligible_block(d):
  """One document of four 128-token blocks, one head, every eligible block selected (budget
  4), so block i's run holds its own 128 tokens first, then the 128 of each later block, and
  every sorted row is a real one. A 128-row item runs one 128-key step per half in the forward;
  in dq (64-key tiles at head_dim 128, else 128) a later block's item runs two steps per half
  at 128, an own-block item one for its first half (rows 0-63 end in the first tile) and two
  for its second; below 128 both halves run the item's steps (ping-pong, or no half steps).
  dk/dv takes 64-row chunk steps at 128 (128 below) per 64-key half, the second half skipping
  the own-block rows before its keys (one 64-row step; none of a 128-row step)."""
  t, block, n = 512, 128, 4
  rng = np.random.default_rng()
  q = jnp.asarray(rng.standard_normal((1, t, 1, d)), jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((1, t, 1, d)), jnp.bfloat16)
  seg = jnp.ones((1, t), jnp.int32)
  sel = jax.jit(lambda q, k: moba_gate(q, k, seg, jnp.asarray([n], jnp.int32), block_size=block,
                                       k_max=n))(q, k)
  work = kernel_work(sel, seg, block=block, hq=1, hkv=1, d=d)
  runs = [n - i for i in range(n)]  # blocks of rows in block i's run: its own and later ones
  items = sum(runs)  # one 128-row item per block of rows
  assert work["forward"]["items"] == items
  assert work["forward"]["steps"] == 2 * items
  assert work["forward"]["flops"] == 2 * 2 * (2 * items) * 64 * 128 * d
  if d >= 128:
    dq_steps = n * (1 + 2) + (items - n) * 4
    dq_tile = 64
  else:
    dq_steps, dq_tile = 2 * items, 128
  assert work["dq"]["steps"] == dq_steps
  assert work["dq"]["flops"] == 2 * 3 * dq_steps * 64 * dq_tile * d
  chunk = 64 if d >= 128 else 128
  per_run = [r * block // chunk for r in runs]
  dkv_steps = sum(per_run) + sum(c - (1 if chunk == 64 else 0) for c in per_run)
  assert work["dk/dv"]["items"] == n  # one 128-key tile per block
  assert work["dk/dv"]["steps"] == dkv_steps
  assert work["dk/dv"]["flops"] == 2 * 4 * dkv_steps * 64 * chunk * d


def test_a_trace_of_another_point_is_an_error(tmp_path, monkeypatch):
  """main() refuses a trace whose point differs from the one it counts, naming the field."""
  trace = tmp_path / "trace.json"
  trace.write_text(json.dumps(dict(seq=512, block=128, k=2, heads="tiny", rows=[])))
  monkeypatch.setattr("sys.argv", ["tensor_work", "--seq", "512", "--block", "128", "--k", "3",
                                   "--heads", "tiny", "--trace", str(trace)])
  with pytest.raises(ValueError, match="traced k=2, not --k 3"):
    tensor_work.main()


@pytest.mark.parametrize("traced, argv, message", [
    (dict(batch=2), [], "traced batch=2, not --batch 1"),
    ({}, ["--batch", "2"], "traced batch=1, not --batch 2"),  # a trace before --batch: one row
])
def test_a_trace_of_another_batch_is_an_error(tmp_path, monkeypatch, traced, argv, message):
  trace = tmp_path / "trace.json"
  trace.write_text(json.dumps(dict(seq=512, block=128, k=3, heads="tiny", rows=[], **traced)))
  monkeypatch.setattr("sys.argv", ["tensor_work", "--seq", "512", "--block", "128", "--k", "3",
                                   "--heads", "tiny", "--trace", str(trace), *argv])
  with pytest.raises(ValueError, match=message):
    tensor_work.main()


def test_main_sets_the_work_beside_useful_flops_and_cudnn(tmp_path, monkeypatch):
  """main()'s report at one document of four 128-token blocks, budget 4 (every block: the
  dense causal pairs, T(T+1)/2 per query head), 2 query heads of 16: the useful forward
  4 * D * pairs, dq half of it and dk/dv twice (3.5x in all); kernel times from a trace whose
  forward is two kernels, beside a step of 10 ms; cuDNN's rate on the GPU's clock from the
  bench JSON."""
  useful = 4 * 16 * 2 * (512 * 513 // 2)
  rows = [dict(kernel="moba_fwd_a", ms_per_step=1.0), dict(kernel="moba_fwd_b", ms_per_step=0.5),
          dict(kernel="moba_dq", ms_per_step=2.0), dict(kernel="moba_dkv", ms_per_step=3.0),
          dict(kernel="moba_gate_topk", ms_per_step=0.25), dict(kernel="loop_fusion",
                                                               ms_per_step=0.75)]
  trace, bench, out = tmp_path / "trace.json", tmp_path / "bench.json", tmp_path / "work.json"
  trace.write_text(json.dumps(dict(seq=512, block=128, k=4, heads="tiny", batch=1,
                                   kernel_ms_per_step=10.0, rows=rows)))
  rate = 0.02  # TF/s
  bench.write_text(json.dumps(dict(rows=[
      dict(kind="cudnn", seq=512, heads="16/16", batch=1, fwdbwd_span_tflops=9.0),
      dict(kind="cudnn", seq=512, heads="2/1", batch=1, fwdbwd_span_tflops=rate)])))
  monkeypatch.setattr("sys.argv", ["tensor_work", "--seq", "512", "--block", "128", "--k", "4",
                                   "--heads", "tiny", "--trace", str(trace), "--bench",
                                   str(bench), "--out", str(out)])
  tensor_work.main()
  got = json.loads(out.read_text())
  kernels = {r["kernel"]: r for r in got["kernels"]}
  want = {"forward": (useful, 1.5), "dq": (useful / 2, 2.0), "dk/dv": (2 * useful, 3.0)}
  assert set(kernels) == set(want)
  for name, (useful_flops, ms) in want.items():
    r = kernels[name]
    assert r["useful_flops"] == pytest.approx(useful_flops, rel=1e-12)
    assert r["work_over_useful"] == pytest.approx(r["flops"] / useful_flops, rel=1e-12)
    assert r["ms"] == pytest.approx(ms, rel=1e-12)
    assert r["tflops_done"] == pytest.approx(r["flops"] / (ms * 1e-3) / 1e12, rel=1e-12)
    assert r["x_cudnn_span"] == pytest.approx(r["tflops_done"] / rate, rel=1e-12)
  s = got["summary"]
  work = sum(r["flops"] for r in kernels.values())
  assert s["useful_fwdbwd_flops"] == pytest.approx(3.5 * useful, rel=1e-12)
  assert s["work_flops"] == pytest.approx(work, rel=1e-12)
  assert s["step_ms"] == 10.0 and s["kernels_ms"] == pytest.approx(6.5, rel=1e-12)
  assert s["other_ms"] == pytest.approx(3.5, rel=1e-12)
  assert s["x_cudnn_span"] == pytest.approx(3.5 * useful / 10e-3 / 1e12 / rate, rel=1e-12)
  # The three kernels at cuDNN's rate on their work, the other 3.5 ms as measured.
  assert s["x_cudnn_if_kernels_at_cudnn_rate"] == pytest.approx(
      (3.5 * useful / (rate * 1e12)) / (work / (rate * 1e12) + 3.5e-3), rel=1e-12)


def test_trace_table_sums_each_kernels_launches():
  """kernel_times: per kernel the ms per step of every traced name holding its mark (the
  forward's two kernels summed); dq's mark does not take dk/dv's kernel, nor any the gate's."""
  rows = [dict(kernel="moba_fwd_hopper_mosaic_gpu_kernel", ms_per_step=1.25),
          dict(kernel="moba_fwd_merge", ms_per_step=0.5), dict(kernel="moba_dq", ms_per_step=2.0),
          dict(kernel="moba_dkv", ms_per_step=3.0), dict(kernel="moba_gate_topk", ms_per_step=0.25),
          dict(kernel="loop_gather_fusion", ms_per_step=7.0)]
  assert kernel_times(dict(rows=rows)) == {"forward": 1.75, "dq": 2.0, "dk/dv": 3.0, "gate": 0.25}


def test_kernel_work_leaves_out_padding():
  """A row of four 128-token blocks whose last two are padding (segment id 0) at budget 4:
  the work of a two-block document (its closed form as above, head_dim 64: 3 items of one
  128-key step per half in the forward and in dq; dk/dv 128-row chunks, 2 + 1 per half) and
  dk/dv's items only the two key tiles of real keys, none of the padding's."""
  t, block, d = 512, 128, 64
  rng = np.random.default_rng()
  q = jnp.asarray(rng.standard_normal((1, t, 1, d)), jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((1, t, 1, d)), jnp.bfloat16)
  seg = jnp.asarray(np.repeat(np.array([[1, 0]], np.int32), t // 2, axis=1))
  sel = jax.jit(lambda q, k: moba_gate(q, k, seg, jnp.asarray([4], jnp.int32), block_size=block,
                                       k_max=4))(q, k)
  work = kernel_work(sel, seg, block=block, hq=1, hkv=1, d=d)
  assert (work["forward"]["items"], work["forward"]["steps"]) == (3, 6)
  assert work["dq"]["steps"] == 6
  assert (work["dk/dv"]["items"], work["dk/dv"]["steps"]) == (2, 6)
  assert work["dk/dv"]["flops"] == 2 * 4 * 6 * 64 * 128 * d
