"""The slot merges alone at one point (kernels.merge_partials: the forward's log-sum-exp merge
of each token's partial outputs, dq's sum), for several token tiles, warp counts and
software-pipeline depths, beside XLA's merge (attention.xla_merge, what runs below the kernel's
k_max threshold):
every configuration's outputs checked against the default's, then its time per call over
back-to-back calls (timing.time_pipelined) and the bytes it must move per second of it.
On the GPU; --interpret runs it on the CPU (small sizes; slow).

    python experiments/merge_tiles.py --heads h64 --block 256 --k 8 \\
        --configs 16,2,3 64,4,1 32,4,2 128,4,2 --out /tmp/merge_tiles.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (HEADS, add_point_args, point_fields,  # noqa: E402
                                      point_inputs)
from pallas_kernels.moba import attention, build_kv_layout, gating, hopper, kernels  # noqa: E402
from sparsebalance_jax.balance.timing import time_pipelined  # noqa: E402


def merge_bytes(part_BGLD, count_BTG, t, hq, forward: bool) -> int:
  """What a merge must move: each used slot's partial row (and lse) read once, the merged row
  (and lse) written once."""
  d, size = part_BGLD.shape[-1], part_BGLD.dtype.itemsize
  slots = int(np.asarray(count_BTG).sum()) * (hq // count_BTG.shape[-1])
  rows = count_BTG.shape[0]
  return slots * (d * size + 4 * forward) + rows * t * hq * (d * size + 4 * forward)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--configs", nargs="+", default=["16,2,3", "64,4,1", "32,4,2"],
                 help="block_tokens,num_warps,num_stages of merge_partials (the first is the "
                      "reference; 16,2,3 is its default)")
  p.add_argument("--calls", type=int, default=100)
  p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU)")
  p.add_argument("--out", required=True)
  args = p.parse_args()
  hq, hkv, _ = HEADS[args.heads]
  d, q, k, _, _, seg, budget = point_inputs(args)
  t = args.seq
  sel = jax.jit(lambda q, k: gating.fused_gate(q, k, seg, budget, block_size=args.block,
                                                k_max=args.k, interpret=args.interpret))(q, k)
  layout = build_kv_layout(sel, seg, num_blocks=t // args.block, group_size=hq // hkv,
                           block_rows=64, mark_full=False, pad_rows=hopper.ITEM_ROWS)
  b, g, l = layout.row_src_BGL.shape
  rng = np.random.default_rng(0)
  part = jnp.asarray(rng.standard_normal((b, g, l, d)), jnp.bfloat16)
  lse = jnp.asarray(rng.uniform(6.0, 9.0, size=(b, g, l)), jnp.float32)
  ok = jnp.ones((b,), bool)
  rows = []
  for forward in (True, False):
    lse_in = lse if forward else None
    nbytes = merge_bytes(part, sel.count_BTG, t, hq, forward)
    variants = []
    for cfg in args.configs:
      tt, warps, stages = (int(x) for x in cfg.split(","))
      variants.append((cfg, jax.jit(
          lambda part, lse_in, sel, layout, tt=tt, warps=warps, stages=stages:
          kernels.merge_partials(part, lse_in, layout.entry_row_BGTK, sel.count_BTG, ok,
                                 group_size=hq // hkv, interpret=args.interpret,
                                 block_tokens=tt, num_warps=warps, num_stages=stages))))
    variants.append(("xla", jax.jit(functools.partial(attention.xla_merge, ok_B=ok,
                                                      group_size=hq // hkv))))
    want = None
    for name, fn in variants:
      operands = (part, lse_in, sel, layout)
      got = jax.tree.map(lambda x: np.asarray(x, np.float32), fn(*operands))
      got = got if forward else (got,)
      want = got if want is None else want
      # The kernels against the first: the same sums in the same order; XLA against it:
      # float32 sums in another order, then one bf16 rounding.
      err = max(float(np.max(np.abs(a - w))) for a, w in zip(got, want))
      ms = 1e3 * time_pipelined(fn, *operands, calls=args.calls, repeats=5)
      row = dict(merge="forward" if forward else "dq", config=name, max_abs_diff=err, ms=ms,
                 tb_per_s=nbytes / ms / 1e9)
      rows.append(row)
      print(row, flush=True)
  with open(args.out, "w") as f:
    json.dump(dict(device=jax.devices()[0].device_kind, **point_fields(args), rows=rows), f,
              indent=1)
  print(f"{'merge':8s} {'config':10s} {'ms':>8s} {'TB/s':>6s}  max |diff| vs first kernel config")
  for r in rows:
    print(f"{r['merge']:8s} {r['config']:10s} {r['ms']:8.4f} {r['tb_per_s']:6.2f}  "
          f"{r['max_abs_diff']:.3g}")


if __name__ == "__main__":
  main()
