"""How fast dense attention runs through Pallas Mosaic GPU on this machine: JAX's own
FlashAttention-3-style kernel (`jax.experimental.pallas.ops.gpu.attention_mgpu`: a TMA producer
warpgroup and two compute warpgroups in ping-pong) beside cuDNN, in one process, at the MoBA
headline shape (S=32K, 16/16 heads x 128), in float16 (that kernel stages a tile in float16
whatever its inputs, so bf16 inputs fail to lower; on Hopper's tensor cores both 16-bit types
run at the same rate).

The MoBA kernels run the same per-tile work on short loops, so this is the rate a Mosaic GPU
port of them could at best approach. That kernel's backward has no causal mask, so the
forward is timed causal and non-causal, forward+backward non-causal only, each against cuDNN
with the same mask.

    python experiments/mosaic_ceiling.py --out /tmp/mosaic_ceiling.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import fwd_bwd, inputs, timeit  # noqa: E402


def _flops(t, hq, d, causal):
  return 4 * d * hq * t * ((t + 1) / 2 if causal else t)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seq", type=int, default=32768)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--block-kv", type=int, nargs="+", default=[128, 64])
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--out", required=True)
  args = p.parse_args()
  from jax.experimental.pallas.ops.gpu import attention_mgpu as fa3  # noqa: PLC0415 (GPU only)

  t, h, d = args.seq, args.heads, args.head_dim
  q, k, v, do = inputs(0, 1, t, h, h, d, jnp.float16)
  rows = []
  for causal in (True, False):
    cud = functools.partial(jax.nn.dot_product_attention, implementation="cudnn",
                            is_causal=causal)
    want = jax.jit(cud)(q, k, v)
    row = dict(kernel="cudnn", causal=causal, fwd_ms=timeit(jax.jit(cud), q, k, v,
                                                             reps=args.reps))
    if not causal:
      row["fwdbwd_ms"] = timeit(fwd_bwd(cud), q, k, v, do, reps=args.reps)
    rows.append(row)
    for bkv in args.block_kv:
      cfg = fa3.TuningConfig(block_q=64, block_kv=bkv, max_concurrent_steps=2, causal=causal,
                             block_q_dkv=64, block_kv_dkv=bkv, block_q_dq=64, block_kv_dq=bkv)
      # That kernel takes no softmax scale: q is scaled first, as cuDNN scales the logits.
      fn = functools.partial(lambda q, k, v, cfg: fa3.attention(q * d ** -0.5, k, v, cfg),
                             cfg=cfg)
      row = dict(kernel=f"mosaic_fa3_bkv{bkv}", causal=causal)
      try:
        got = jax.jit(fn)(q, k, v)
        row["rel_err_vs_cudnn"] = float(
            jnp.linalg.norm((got - want).astype(jnp.float32))
            / jnp.linalg.norm(want.astype(jnp.float32)))
        row["fwd_ms"] = timeit(jax.jit(fn), q, k, v, reps=args.reps)
        if not causal:
          row["fwdbwd_ms"] = timeit(fwd_bwd(fn), q, k, v, do, reps=args.reps)
      except Exception as e:  # a config that does not fit or compile is reported, not fatal
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
      rows.append(row)
      print(row, flush=True)
  for r in rows:
    f = _flops(t, h, d, r["causal"])
    if "fwd_ms" in r:
      r["fwd_tflops"] = f / r["fwd_ms"] / 1e9
    if "fwdbwd_ms" in r:
      r["fwdbwd_tflops"] = 3.5 * f / r["fwdbwd_ms"] / 1e9
  with open(args.out, "w") as fh:
    json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, seq=t, heads=h,
                   head_dim=d, dtype="float16", rows=rows), fh, indent=1)
  print(f"\n{'kernel':20s} {'causal':6s} {'fwd ms':>8s} {'fwd TF/s':>9s} {'fb ms':>8s} "
        f"{'fb TF/s':>8s}  rel err")
  for r in rows:
    fb = (f"{r['fwdbwd_ms']:8.3f} {r['fwdbwd_tflops']:8.1f}" if "fwdbwd_ms" in r
          else f"{'-':>8s} {'-':>8s}")
    fw = (f"{r['fwd_ms']:8.3f} {r['fwd_tflops']:9.1f}" if "fwd_ms" in r
          else f"{'-':>8s} {'-':>9s}")
    err = f"{r['rel_err_vs_cudnn']:.1e}" if "rel_err_vs_cudnn" in r else r.get("error", "")
    print(f"{r['kernel']:20s} {str(r['causal']):6s} {fw} {fb}  {err}")


if __name__ == "__main__":
  main()
