"""The persistent warp-specialized Mosaic GPU forward (hopper.moba_forward_rows) timed alone
beside the Triton forward kernel at one attention shape, for several key tiles and pipeline
depths; every configuration's rows checked against the Triton kernel's with the same
key tile first. GPU only.

    python experiments/persistent_forward.py --heads h128 --block 512 --k 3 \\
        --configs 128,2 64,2 64,3 --out /tmp/persistent.json
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
from experiments.bench_kernel import HEADS, add_point_args, point_inputs, timeit  # noqa: E402
from pallas_kernels.moba import MobaBlockSizes, build_kv_layout, hopper, kernels  # noqa: E402
from pallas_kernels.moba.attention import _fused_gate  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--configs", nargs="+", default=["128,2", "64,2", "64,3"],
                 help="block_kv,stages of the persistent kernel")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--out", required=True)
  args = p.parse_args()
  hq, hkv, _ = HEADS[args.heads]
  t, block = args.seq, args.block
  d, q, k, v, _, seg, budget = point_inputs(args)
  sel = jax.jit(lambda q, k: _fused_gate(q, k, seg, budget, block_size=block, k_max=args.k,
                                         interpret=False))(q, k)
  q_flat = q.reshape(1, t * hq, d)
  result = dict(device=jax.devices()[0].device_kind, seq=t, block=block, k=args.k,
                heads=args.heads, rows=[])
  base = MobaBlockSizes().fit(block, d)
  layout = lambda pad: build_kv_layout(sel, seg, num_blocks=t // block, group_size=hq // hkv,
                                       block_rows=64, mark_full=False, pad_rows=pad)
  triton_fwd = lambda lay, tiles: jax.jit(lambda q_flat, k, v: kernels.moba_forward_rows(
      q_flat, lay, k, v, seg, block_size=block, bs=tiles, interpret=False))
  row = dict(kernel="triton", block_k=base.block_k,
             ms=timeit(triton_fwd(layout(None), base), q_flat, k, v, reps=args.reps))
  result["rows"].append(row)
  print(row, flush=True)

  lay = layout(hopper.ITEM_ROWS)
  real = np.repeat(np.asarray(lay.chunk_block_BGC) >= 0, 64, axis=-1) & (
      np.asarray(lay.row_seg_BGL) != 0)
  for cfg in args.configs:
    bkv, stages = (int(x) for x in cfg.split(","))
    row = dict(kernel="mosaic", block_k=bkv, stages=stages)
    try:
      pers = jax.jit(lambda q_flat, k, v, bkv=bkv, stages=stages: hopper.moba_forward_rows(
          q_flat, lay, k, v, seg, block_size=block, bs=base, interpret=False, block_kv=bkv,
          stages=stages))
      got_o, got_lse = pers(q_flat, k, v)
      want_o, want_lse = triton_fwd(lay, dataclasses.replace(base, block_k=bkv))(q_flat, k, v)
      row["max_abs_lse_diff"] = float(np.abs(np.asarray(got_lse)[real]
                                             - np.asarray(want_lse)[real]).max())
      row["max_abs_out_diff"] = float(np.abs(np.asarray(got_o, np.float32)[real]
                                             - np.asarray(want_o, np.float32)[real]).max())
      row["ms"] = timeit(pers, q_flat, k, v, reps=args.reps)
    except Exception as e:  # a configuration that does not fit is reported, not fatal
      row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    result["rows"].append(row)
    print(row, flush=True)
  with open(args.out, "w") as fh:
    json.dump(result, fh, indent=1)
  print(f"\n{'kernel':18s} {'block_k':>7s} {'stages':>6s} {'ms':>7s} {'lse diff':>9s} "
        f"{'out diff':>9s}")
  for r in result["rows"]:
    if "error" in r:
      print(f"{r['kernel']:18s} {r['block_k']:7d} {r.get('stages', 0):6d}  {r['error']}")
      continue
    print(f"{r['kernel']:18s} {r['block_k']:7d} {r.get('stages', 0):6d} {r['ms']:7.3f} "
          f"{r.get('max_abs_lse_diff', 0):9.2e} {r.get('max_abs_out_diff', 0):9.2e}")


if __name__ == "__main__":
  main()
