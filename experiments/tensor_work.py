"""The tensor-core work each Hopper kernel does at one point, counted from its item plans (no
GPU): the products every item's tiles take, against the useful FLOPs the benchmarks count
(4 * D per attended (query, key) pair forward, 2.5x that backward). With a traced step
(`trace_moba.py --out`) and a `bench_kernel.py --out` JSON holding that run's cuDNN row, it
also gives each kernel's rate on the work it does and sets it beside cuDNN's rate on the GPU's
clock: what separates the step from cuDNN's useful-FLOP rate, kernel speed or the work the
structure adds (dq's products again in dk/dv, masked tiles, padding rows, merges, gating).

    python -m experiments.tensor_work --seq 32768 --block 512 --k 3 --heads h128 \\
        --trace trace.json --bench bench.json --out work.json

The gate's selection is the XLA gate's (`moba_gate`) on bench_kernel's inputs (seed 0), which
the fused gate matches but for near ties; counting takes under a minute on the CPU at S=32K.
A trace or cuDNN row of another point is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (add_point_args, attended_pairs, HEADS,  # noqa: E402
                                      point_fields, point_inputs, recorded_point)
from experiments.h200.trace_table import kernel_times  # noqa: E402
from pallas_kernels.moba import hopper, moba_gate  # noqa: E402
from pallas_kernels.moba.kv_layout import build_kv_layout  # noqa: E402

_HALF = hopper.ITEM_ROWS // 2  # a compute warpgroup's rows (forward, dq) or keys (dk/dv)


def kernel_work(sel, seg, *, block: int, hq: int, hkv: int, d: int) -> dict[str, dict]:
  """Per kernel: the products its compute warpgroups issue at the step's defaults (key tiles,
  half steps, chunk rows by head_dim: hopper.forward_schedule, dq_schedule, dkv_chunk_rows),
  as FLOPs (2 per multiply-add), steps summed over the 64-row (64-key) halves - key steps
  (forward, dq) or chunk steps (dk/dv) - and items (dk/dv: key tiles with steps)."""
  t = seg.shape[1]
  layout = build_kv_layout(sel, seg, num_blocks=t // block, group_size=hq // hkv,
                           block_rows=_HALF, mark_full=False, pad_rows=hopper.ITEM_ROWS)
  out = {}
  for name, sched, products in (("forward", hopper.forward_schedule(d), 2),
                                ("dq", hopper.dq_schedule(d), 3)):
    block_kv, half_steps = min(sched.block_kv, block), sched.half_steps
    ids, num, _, steps_F2, _ = jax.jit(
        lambda layout, seg: hopper.persistent_items(layout, seg, block_size=block,
                                                    block_kv=block_kv))(layout, seg)
    steps_I2 = np.asarray(steps_F2)[np.asarray(ids)[:int(num[0])]]  # used items' two halves
    if not half_steps:  # both warpgroups run the item's longer half's steps
      steps_I2 = np.repeat(steps_I2.max(axis=1, keepdims=True), 2, axis=1)
    steps = int(steps_I2.sum())
    out[name] = dict(steps=steps, items=len(steps_I2),
                     flops=2.0 * products * steps * _HALF * block_kv * d)
  chunk = hopper.dkv_chunk_rows(d)
  first_BGnW, end_BGn = jax.jit(lambda layout, seg: hopper.dkv_chunk_steps(
      layout, seg, block_size=block, chunk=chunk, group_heads=hq // hkv))(layout, seg)
  steps_BGnW = np.maximum(np.asarray(end_BGn)[..., None] - np.asarray(first_BGnW), 0)
  steps = int(steps_BGnW.sum())
  out["dk/dv"] = dict(steps=steps, items=int((steps_BGnW[..., 0] > 0).sum()),  # key tiles
                      flops=2.0 * 4 * steps * _HALF * chunk * d)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  add_point_args(p)
  p.add_argument("--trace", help="trace_moba.py's JSON of the same point (kernel times)")
  p.add_argument("--bench", help="bench_kernel.py's JSON with the same run's cuDNN row")
  p.add_argument("--out", help="write the rows as JSON here")
  args = p.parse_args()
  hq, hkv, d = HEADS[args.heads]
  _, q, k, _, _, seg, budget = point_inputs(args)
  sel = jax.jit(lambda q, k: moba_gate(q, k, seg, budget, block_size=args.block,
                                       k_max=args.k))(q, k)
  useful_fwd = 4.0 * d * attended_pairs(sel, args.block, hq // hkv)
  work = kernel_work(sel, seg, block=args.block, hq=hq, hkv=hkv, d=d)
  # The useful FLOPs each kernel's products stand for: the forward's two, the backward's five
  # (S and dP once, dV, dK in dk/dv, dQ in dq).
  useful = {"forward": useful_fwd, "dq": useful_fwd / 2, "dk/dv": useful_fwd * 2}
  useful_fb = sum(useful.values())  # 3.5x the forward's, as bench_kernel counts
  times, cudnn = {}, None
  if args.trace:
    trace = json.load(open(args.trace))
    for key, value in point_fields(args).items():
      if recorded_point(trace, key) != value:
        raise ValueError(f"{args.trace} traced {key}={recorded_point(trace, key)}, not --{key} "
                         f"{value}")
    times = dict(kernel_times(trace), step=trace["kernel_ms_per_step"])
  if args.bench:
    want = dict(seq=args.seq, heads="{}/{}".format(*HEADS[args.heads][:2]), batch=args.batch)
    cudnn = next((r for r in json.load(open(args.bench))["rows"] if r.get("kind") == "cudnn"
                  and all(recorded_point(r, key) == value for key, value in want.items())),
                 None)
    if cudnn is None:
      raise ValueError(f"{args.bench} holds no cuDNN row at {want}")
  print(f"S={args.seq} block {args.block} k={args.k} {hq}/{hkv} x {d}: useful forward "
        f"{useful_fwd / 1e12:.3f} TFLOP, forward+backward {useful_fb / 1e12:.3f}")
  print(f"{'kernel':8s} {'steps':>8s} {'TFLOP done':>10s} {'x useful':>8s} {'ms':>7s} "
        f"{'TF/s done':>9s} {'x cuDNN':>7s}")
  report = []
  for name, w in work.items():
    row = dict(kernel=name, **w, useful_flops=useful[name], work_over_useful=w["flops"] /
               useful[name])
    line = (f"{name:8s} {w['steps']:8d} {w['flops'] / 1e12:10.3f} "
            f"{row['work_over_useful']:8.2f}")
    if name in times:
      row["ms"] = times[name]
      row["tflops_done"] = w["flops"] / times[name] / 1e9
      line += f" {times[name]:7.3f} {row['tflops_done']:9.1f}"
      if cudnn:
        row["x_cudnn_span"] = row["tflops_done"] / cudnn["fwdbwd_span_tflops"]
        line += f" {row['x_cudnn_span']:7.3f}"
    print(line)
    report.append(row)
  total = sum(w["flops"] for w in work.values())
  summary = dict(useful_fwdbwd_flops=useful_fb, work_flops=total,
                 work_over_useful=total / useful_fb)
  print(f"all three: {total / 1e12:.3f} TFLOP done for {useful_fb / 1e12:.3f} useful "
        f"({summary['work_over_useful']:.2f}x)")
  if times:
    kernels_ms = sum(times[n] for n in work)
    summary.update(step_ms=times["step"], kernels_ms=kernels_ms,
                   other_ms=times["step"] - kernels_ms)
    print(f"step {times['step']:.3f} ms of GPU time: the three kernels {kernels_ms:.3f}, the "
          f"rest (merges, gating, item lists, glue) {times['step'] - kernels_ms:.3f}")
    if cudnn:
      rate = cudnn["fwdbwd_span_tflops"]
      summary.update(cudnn_span_tflops=rate,
                     x_cudnn_span=useful_fb / times["step"] / 1e9 / rate,
                     x_cudnn_if_kernels_at_cudnn_rate=useful_fb / 1e9 / rate
                     / (total / 1e9 / rate + times["step"] - kernels_ms))
      print(f"cuDNN {rate:.1f} TF/s on the GPU's clock: the step {summary['x_cudnn_span']:.3f}x; "
            f"with the three kernels at cuDNN's rate on the work they do "
            f"{summary['x_cudnn_if_kernels_at_cudnn_rate']:.3f}x")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(point=vars(args), kernels=report, summary=summary), f, indent=1)


if __name__ == "__main__":
  main()
