"""One MoBA forward+backward per block-size variant, for Nsight Compute to profile.

Compiles and runs each variant once (the launch ncu captures), nothing else: the three
attention kernels are named moba_fwd, moba_dq and moba_dkv, so

    ncu --clock-control none -k regex:'moba_(fwd|dq|dkv)' -c 6 --set full -o $OUT/moba \\
        python3 experiments/ncu_moba.py --variants "64,64,64,4,2;64,64,64,4,2,1"
    ncu --import $OUT/moba.ncu-rep --page details --csv > $OUT/moba.csv

profiles each kernel of both variants once (3 kernels x 2 variants). Variants use
bench_kernel.py's syntax; inputs and budgets are bench_kernel.py's (one document per row,
budget = k_max = --k, random normal bf16). --backend picks the kernel set (the Hopper kernels
are moba_fwd_hopper, moba_dq_hopper, moba_dkv_hopper); --cudnn also runs cuDNN's dense causal
forward+backward on the same shape once, after the variants, so that one profile holds both
(select its kernels with a regex of their own, e.g. regex:'moba_|cudnn|flash|fmha').
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (add_point_args, dense_causal, fwd_bwd,  # noqa: E402
                                      parse_variant, point_inputs, variant_tag)
from pallas_kernels.moba.attention import BACKENDS  # noqa: E402
from pallas_kernels.moba import moba_attention  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--variants", default="64,64,64,4,2")
  p.add_argument("--backend", default="triton", choices=sorted(BACKENDS))
  p.add_argument("--cudnn", action="store_true",
                 help="then cuDNN's dense causal forward+backward once")
  p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU smoke)")
  args = p.parse_args()
  d, q, k, v, do, seg, budget = point_inputs(args)
  for text in args.variants.split(";"):
    bs = parse_variant(text)
    def attend(q, k, v, bs=bs):
      return moba_attention(q, k, v, seg, budget, block_size=args.block, k_max=args.k,
                            block_sizes=bs, backend=args.backend, interpret=args.interpret)
    jax.block_until_ready(fwd_bwd(attend)(q, k, v, do))
    print(f"ran {variant_tag(bs.fit(args.block, d))}", flush=True)
  if args.cudnn:
    jax.block_until_ready(fwd_bwd(dense_causal(args.interpret))(q, k, v, do))
    print("ran cudnn", flush=True)


if __name__ == "__main__":
  main()
