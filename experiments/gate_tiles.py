"""The gate's top-k kernel (gating.moba_gate_topk) alone at one point, for several token
tiles, warp counts and block chunks: every configuration's picks checked equal to the first's, then
its time per call over back-to-back calls (timing.time_pipelined: for a kernel this short a
synchronised call would time mostly its dispatch). GPU only.

    python experiments/gate_tiles.py --heads h128 --block 512 --k 3 \\
        --configs 128,8 64,4 128,4,32 32,4 --out /tmp/gate_tiles.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import add_point_args, point_fields, point_inputs  # noqa: E402
from pallas_kernels.moba.gating import gate_kernel_operands, moba_gate_topk  # noqa: E402
from sparsebalance_jax.balance.timing import time_pipelined  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--configs", nargs="+", default=["128,8", "64,4", "128,4"],
                 help="tile,num_warps[,chunk] of the gate kernel (the first is the reference; "
                      "128,8 is moba_gate_topk's default up to 64 blocks; chunk: blocks per "
                      "program, default moba_gate_topk's choice for the tile)")
  p.add_argument("--calls", type=int, default=200)
  p.add_argument("--out", required=True)
  args = p.parse_args()
  _, q, k, _, _, seg, _ = point_inputs(args)
  operands = (*gate_kernel_operands(q, k, seg, block_size=args.block), seg)
  rows, want = [], None
  for cfg in args.configs:
    tile, warps, *chunk = (int(x) for x in cfg.split(","))
    chunk = chunk[0] if chunk else None
    fn = jax.jit(lambda qh, ql, gh, gl, trail, seg, tile=tile, warps=warps, chunk=chunk:
                 moba_gate_topk(qh, ql, gh, gl, trail, seg, block_size=args.block,
                                num_picks=args.k - 1, interpret=False, tile=tile,
                                num_warps=warps, chunk=chunk))
    got = np.asarray(fn(*operands))
    want = got if want is None else want
    row = dict(tile=tile, num_warps=warps, chunk=chunk,
               picks_equal=bool(np.array_equal(got, want)),
               ms=1e3 * time_pipelined(fn, *operands, calls=args.calls, repeats=5))
    rows.append(row)
    print(row, flush=True)
  with open(args.out, "w") as f:
    json.dump(dict(device=jax.devices()[0].device_kind, **point_fields(args), rows=rows), f,
              indent=1)
  print(f"{'tile':>5} {'warps':>5} {'chunk':>5} {'ms':>8}  picks equal to the first")
  for r in rows:
    print(f"{r['tile']:5d} {r['num_warps']:5d} {str(r['chunk']):>5} {r['ms']:8.4f}  "
          f"{r['picks_equal']}")


if __name__ == "__main__":
  main()
