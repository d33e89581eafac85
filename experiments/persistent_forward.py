"""The persistent warp-specialized Mosaic GPU kernels (hopper.moba_forward_rows,
moba_dq_rows, moba_dkv) timed alone beside the Triton forward, dq and dk/dv kernels at one
attention shape, for several key tiles and pipeline depths; every configuration's outputs
checked against the Triton kernel's with the same key tile first. Each is timed by the
synchronised wall clock (ms) and by the same kind of calls' span on the GPU's clock (gpu_ms);
rank configurations by gpu_ms (a sub-millisecond call's wall clock carries ~0.4 ms of host
work, whose noise reordered the forward's configurations, BENCHMARKS.md). GPU only.

    python experiments/persistent_forward.py --heads h128 --block 512 --k 3 \\
        --configs 128,2,1 128,2,0 --dq-configs 64,3/2,1,1,1 64,2,0,0,0 --dkv-stages 2 \\
        --out /tmp/persistent.json

A configuration's stages are one depth for K and V or K's/V's (3/2). A trailing pingpong
field (forward, dq; dk/dv: "stages,pingpong") sets the kernels' ping-pong between their
compute warpgroups; left out, the kernel's default for the head_dim (the other fields are
always the configuration's: overlap, when left out, is on).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (add_point_args, device_span, kernel_point,  # noqa: E402
                                      point_fields, timeit)
from sparsebalance_jax.balance.timing import clocked_call  # noqa: E402
from pallas_kernels.moba import MobaBlockSizes, hopper, kernels  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--configs", nargs="+", default=["128,2,1", "128,2,0"],
                 help="block_kv,stages,overlap[,pingpong] of the persistent forward")
  p.add_argument("--dq-configs", nargs="*", default=["64,3/2,1,1,1", "64,3/2,1,1,0"],
                 help="block_kv,stages,presorted,sorted_do,overlap[,pingpong] of the persistent "
                      "dq kernel "
                      "(sorted_do: q's rows put in sorted order by the row-gather kernel inside "
                      "the timed call, dO's gathered by the dq kernel)")
  p.add_argument("--dkv-stages", nargs="*", default=["2", "3"],
                 help="chunk pipeline depths of the dk/dv kernel, each optionally ',pingpong'")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--out", required=True)
  args = p.parse_args()
  block = args.block
  d, k, v, seg, layout, q_flat, do_flat, lse, delta = kernel_point(args)
  result = dict(device=jax.devices()[0].device_kind, **point_fields(args), rows=[])
  base = MobaBlockSizes().fit(block, d)

  def record(**row):
    result["rows"].append(row)
    print(row, flush=True)

  def times(fn, *operands):
    """ms: synchronised wall clock (the project's rule, dispatch included); gpu_ms: the same
    calls' span on the GPU's clock, which ranks sub-millisecond kernels without the host's
    noise (BENCHMARKS.md: the two ranked the forward's configurations differently)."""
    return dict(ms=timeit(fn, *operands, reps=args.reps),
                gpu_ms=device_span(clocked_call(fn), *operands, reps=args.reps))

  triton_fwd = lambda lay, tiles: jax.jit(lambda q_flat, k, v: kernels.moba_forward_rows(
      q_flat, lay, k, v, seg, block_size=block, bs=tiles, interpret=False))
  record(kernel="triton", block_k=base.block_k,
         **times(triton_fwd(layout(None), base), q_flat, k, v))

  lay = layout(hopper.ITEM_ROWS)
  real = np.repeat(np.asarray(lay.chunk_block_BGC) >= 0, 64, axis=-1) & (
      np.asarray(lay.row_seg_BGL) != 0)

  def mosaic_rows(kernel, configs, run_mosaic, run_triton, operands, rows):
    """Times run_mosaic(bkv, stages, *extra)(*operands) per config 'bkv,stages[,extra...]'
    (stages: 'n' or 'k/v') after checking its outputs against run_triton(bkv)(*operands)
    (tuples of arrays, compared on as many as both give; those whose `rows` entry is True
    are per sorted row, compared on the real rows, the others whole)."""
    for cfg in configs:
      bkv, stages, *extra = cfg.split(",")
      bkv, extra = int(bkv), [int(x) for x in extra]
      depths = tuple(int(x) for x in stages.split("/"))
      row = dict(kernel=kernel, block_k=bkv, stages=stages, extra=extra)
      try:
        fn = run_mosaic(bkv, depths[0] if len(depths) == 1 else depths, *extra)
        got, want = fn(*operands), run_triton(bkv)(*operands)
        pick = lambda x, by_row: np.asarray(x, np.float32)[real] if by_row else np.asarray(
            x, np.float32)
        row["max_abs_diff"] = [float(np.abs(pick(g, r) - pick(w, r)).max())
                               for g, w, r in zip(got, want, rows)]
        row.update(times(fn, *operands))
      except Exception as e:  # a configuration that does not fit is reported, not fatal
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
      record(**row)

  tiles = lambda bkv: dataclasses.replace(base, block_k=bkv)
  flag = lambda field: bool(field[0]) if field else None  # an optional trailing 0/1 field
  mosaic_rows(
      "mosaic forward", args.configs,
      lambda bkv, stages, overlap=1, *pingpong: jax.jit(
          lambda q_flat, k, v: hopper.moba_forward_rows(
              q_flat, lay, k, v, seg, block_size=block, bs=base, interpret=False, block_kv=bkv,
              stages=stages, overlap=bool(overlap), pingpong=flag(pingpong))),
      lambda bkv: triton_fwd(lay, tiles(bkv)), (q_flat, k, v), rows=(True, True))

  dq_operands = (q_flat, do_flat, lse, delta, k, v)
  triton_dq = lambda lay, tiles: jax.jit(lambda q_flat, do_flat, lse, delta, k, v: (
      kernels.moba_dq_rows(q_flat, do_flat, lse, delta, lay, k, v, seg, block_size=block,
                           bs=tiles, interpret=False),))
  record(kernel="triton dq", block_k=base.block_k,
         **times(triton_dq(layout(None), base), *dq_operands))
  mosaic_rows(
      "mosaic dq", args.dq_configs,
      lambda bkv, stages, presorted, sorted_do=0, overlap=1, *pingpong: jax.jit(
          lambda q_flat, do_flat, lse, delta, k, v: tuple(jax.tree.leaves(hopper.moba_dq_rows(
              q_flat, do_flat, lse, delta, lay, k, v, seg, block_size=block, bs=base,
              interpret=False, block_kv=bkv, stages=stages, presorted=bool(presorted),
              sorted_do=bool(sorted_do), overlap=bool(overlap), pingpong=flag(pingpong))))),
      lambda bkv: triton_dq(lay, tiles(bkv)), dq_operands, rows=(True,))

  triton_dkv = lambda lay: jax.jit(lambda q_flat, do_flat, lse, delta, k, v: kernels.moba_dkv(
      q_flat, do_flat, lse, delta, lay, k, v, seg, block_size=block, bs=base, interpret=False))
  record(kernel="triton dkv", block_k=base.block_k_dkv,
         **times(triton_dkv(layout(None)), *dq_operands))
  mosaic_rows(
      "mosaic dkv", [f"{hopper.DKV_TILE},{n}" for n in args.dkv_stages],
      lambda _, stages, *pingpong: jax.jit(
          lambda q_flat, do_flat, lse, delta, k, v: hopper.moba_dkv(
              q_flat, do_flat, lse, delta, lay, k, v, seg, block_size=block, bs=base,
              interpret=False, stages=stages, pingpong=flag(pingpong))),
      lambda _: triton_dkv(lay), dq_operands, rows=(False, False))
  # What the backward kernels' inputs cost: q and dO put into sorted order by the Triton row
  # gather the kernels call (gather_rows; in a step the forward stores q's), and by XLA.
  record(kernel="gather q, dO", block_k=0, **times(jax.jit(
      lambda q_flat, do_flat: (hopper.gather_rows(q_flat, lay, False),
                               hopper.gather_rows(do_flat, lay, False))), *dq_operands[:2]))
  record(kernel="xla sort q, dO", block_k=0, **times(jax.jit(
      lambda q_flat, do_flat: (hopper.sorted_rows(q_flat, lay), hopper.sorted_rows(do_flat, lay))),
      *dq_operands[:2]))
  with open(args.out, "w") as fh:
    json.dump(result, fh, indent=1)
  print(f"\n{'kernel':18s} {'block_k':>7s} {'stages':>6s} {'extra':>5s} {'ms':>7s} "
        f"{'gpu_ms':>7s}  max |diff| vs Triton (forward: out, lse; dq; dk, dv)")
  for r in result["rows"]:
    if "error" in r:
      print(f"{r['kernel']:18s} {r['block_k']:7d} {str(r.get('stages', '')):>6s}       "
            f"{r['error']}")
      continue
    diffs = " ".join(f"{x:.2e}" for x in r.get("max_abs_diff", []))
    extra = ",".join(str(x) for x in r.get("extra", []))  # the configuration's flags
    print(f"{r['kernel']:18s} {r['block_k']:7d} {str(r.get('stages', '')):>6s} {extra:>5s} "
          f"{r['ms']:7.3f} {r['gpu_ms']:7.3f}  {diffs}")


if __name__ == "__main__":
  main()
