"""Where one MoBA forward+backward spends GPU time: every kernel of the jitted step, from a
profiler trace (the attention kernels, the gate, the layout passes, XLA's merge and gather
fusions), not just the three Pallas kernels that bench_kernel.py --profile times alone.

    PYTHONUNBUFFERED=1 python3 experiments/trace_moba.py --seq 32768 --block 512 --k 3 \\
        --heads h128 --out $OUT/trace_h128.json

Runs the step to warm up, traces --reps more under `jax.profiler.trace`, and sums the device
events of the GPU's stream threads by kernel name. Then traces the gating alone (the fused gate
kernel, the selection and the KV layout, jitted by themselves) the same way, so the gating's
share of the step is a ratio of GPU times, free of the dispatch and synchronisation a wall
clock adds to a sub-millisecond call. Prints one table (ms per step, share of the summed
kernel time) and writes it, with every thread's total, to --out.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (add_point_args, parse_variant, point_fields,  # noqa: E402
                                      point_inputs, step_gating)
from pallas_kernels.moba import MobaBlockSizes, moba_attention  # noqa: E402
from pallas_kernels.moba.attention import BACKENDS  # noqa: E402


def _gpu_threads(events) -> tuple[set, dict]:
  """The '/device:GPU...' processes' ids and their threads' names by (pid, tid)."""
  gpu_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
              and str(e["args"].get("name", "")).startswith("/device:GPU")}
  threads = {(e["pid"], e["tid"]): str(e["args"].get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] in gpu_pids}
  return gpu_pids, threads


def device_kernel_times(trace: dict) -> tuple[dict[str, tuple[float, int]], dict[str, float]]:
  """({kernel name: (total microseconds, count)}, {thread: total microseconds}) over the
  'Stream ...' threads of '/device:GPU...' processes of a Chrome-format trace. Derived
  timelines of the same process ('XLA Ops', 'XLA Modules') repeat the kernels' time and are
  only reported per thread."""
  events = trace["traceEvents"]
  gpu_pids, threads = _gpu_threads(events)
  if not gpu_pids:
    raise ValueError("the trace holds no /device:GPU process (no GPU kernels were traced)")
  kernels: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
  per_thread: dict[str, float] = collections.defaultdict(float)
  for e in events:
    if e.get("ph") != "X" or e.get("pid") not in gpu_pids:
      continue
    thread = threads.get((e["pid"], e.get("tid")), "?")
    per_thread[thread] += float(e.get("dur", 0.0))
    if thread.startswith("Stream"):
      kernels[e["name"]][0] += float(e.get("dur", 0.0))
      kernels[e["name"]][1] += 1
  return {k: (v[0], v[1]) for k, v in kernels.items()}, dict(per_thread)


_LIBRARY_MARKS = ("gemm", "cutlass", "nvjet", "xmma", "cublas", "cudnn", "sm90_", "flash")


def kernel_group(name: str) -> str:
  """The group a GPU kernel's trace name falls in: moba_pallas (the MoBA Pallas kernels,
  `moba_*`), collectives (NCCL), matmul_library (cuBLAS / cuDNN kernels) or xla_other (XLA's
  own fusions)."""
  low = name.lower()
  if low.startswith("moba_"):
    return "moba_pallas"
  if "nccl" in low:
    return "collectives"
  if any(mark in low for mark in _LIBRARY_MARKS):
    return "matmul_library"
  return "xla_other"


def stream_kernels(trace: dict) -> list[tuple[float, float, str]]:
  """(start, end, name) in microseconds of the kernels on the GPU's stream threads, by start."""
  events = trace["traceEvents"]
  streams = {key for key, name in _gpu_threads(events)[1].items() if name.startswith("Stream")}
  return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"])
                for e in events
                if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in streams)


def step_spans(trace: dict, reps: int) -> tuple[float, float]:
  """(span, idle) in microseconds per step, averaged over `reps` steps traced one after the
  other: span from a step's first kernel start to its last kernel end on the GPU's stream
  threads, idle = the part of it no kernel ran (the GPU waiting for launches). Steps are
  told apart by the reps - 1 longest gaps between kernels (the host's wait for each step)."""
  spans = [(start, end) for start, end, _ in stream_kernels(trace)]
  if len(spans) < reps:
    raise ValueError(f"{len(spans)} kernels on the GPU's streams cannot make {reps} steps")
  # Gap before kernel i: from the latest end so far (kernels of two streams may overlap).
  ends, gaps = spans[0][1], []
  for i in range(1, len(spans)):
    gaps.append((spans[i][0] - ends, i))
    ends = max(ends, spans[i][1])
  cuts = sorted(i for _, i in sorted(gaps, reverse=True)[:reps - 1])
  span = idle = 0.0
  for lo, hi in zip([0] + cuts, cuts + [len(spans)]):
    step = spans[lo:hi]
    end = max(e for _, e in step)
    busy, cur_start, cur_end = 0.0, step[0][0], step[0][1]
    for a, b in step[1:]:
      if a > cur_end:
        busy += cur_end - cur_start
        cur_start, cur_end = a, b
      else:
        cur_end = max(cur_end, b)
    busy += cur_end - cur_start
    span += end - step[0][0]
    idle += end - step[0][0] - busy
  return span / reps, idle / reps


def host_event_times(trace: dict, top: int) -> list[tuple[str, float, int]]:
  """The `top` host-side event names by total microseconds: (name, total, count) over the
  processes that are not GPUs (where a call's dispatch and launch time goes)."""
  events = trace["traceEvents"]
  gpu_pids = _gpu_threads(events)[0]
  totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
  for e in events:
    if e.get("ph") == "X" and e.get("pid") not in gpu_pids:
      totals[e["name"]][0] += float(e.get("dur", 0.0))
      totals[e["name"]][1] += 1
  ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
  return [(name, us, n) for name, (us, n) in ranked]


def load_trace(log_dir: str) -> dict:
  paths = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.trace.json.gz"))
  if len(paths) != 1:
    raise ValueError(f"expected one *.trace.json.gz under {log_dir}, found {paths}")
  with gzip.open(paths[0], "rt") as f:
    return json.load(f)


def traced_kernel_us(fn, *args, reps: int):
  """device_kernel_times of reps calls of fn(*args) after one warm-up call (per kernel, per
  thread), their step_spans and the top host events (host_event_times)."""
  jax.block_until_ready(fn(*args))
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir):
      for _ in range(reps):
        jax.block_until_ready(fn(*args))
    trace = load_trace(log_dir)
    return (*device_kernel_times(trace), step_spans(trace, reps), host_event_times(trace, 15))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--variant", default=None, help="bench_kernel.py variant syntax; default tiles")
  p.add_argument("--backend", default="triton", choices=sorted(BACKENDS))
  p.add_argument("--k-max", type=int, default=None,
                 help="the compiled k_max (default --k): a budget below it, as a tuned run has")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--out", default=None)
  p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU smoke)")
  p.add_argument("--hlo", default=None, metavar="DIR",
                 help="also write the compiled HLO of the step and of the gating to "
                      "DIR/{step,gating}.hlo.txt: what each fusion of the table computes")
  args = p.parse_args()
  _, q, k, v, do, seg, budget = point_inputs(args)
  bs = parse_variant(args.variant) if args.variant else None
  k_max = args.k_max or args.k
  attend = lambda q, k, v, seg, budget: moba_attention(
      q, k, v, seg, budget, block_size=args.block, k_max=k_max, block_sizes=bs,
      backend=args.backend, interpret=args.interpret)
  # Segments and budget are arguments, as in a training step (a closed-over constant could be
  # folded into the compiled program).
  step = jax.jit(jax.grad(lambda q, k, v, do, seg, budget: jnp.sum(
      attend(q, k, v, seg, budget).astype(jnp.float32) * do.astype(jnp.float32)),
      argnums=(0, 1, 2)))
  kernels, per_thread, (span, idle), host = traced_kernel_us(step, q, k, v, do, seg, budget,
                                                             reps=args.reps)
  gating = jax.jit(lambda q, k, seg, budget: step_gating(
      q, k, seg, budget, block_size=args.block, k_max=k_max, bs=bs or MobaBlockSizes(),
      interpret=args.interpret, backend=args.backend))
  gate_kernels, _, (gate_span, gate_idle), gate_host = traced_kernel_us(
      gating, q, k, seg, budget, reps=args.reps)
  if args.hlo:
    os.makedirs(args.hlo, exist_ok=True)
    for name, fn, fn_args in (("step", step, (q, k, v, do, seg, budget)),
                              ("gating", gating, (q, k, seg, budget))):
      with open(os.path.join(args.hlo, f"{name}.hlo.txt"), "w") as f:
        f.write(fn.lower(*fn_args).compile().as_text())
  total = sum(us for us, _ in kernels.values())
  gate_total = sum(us for us, _ in gate_kernels.values())
  rows = sorted(({"kernel": name, "ms_per_step": us / args.reps / 1e3,
                  "launches_per_step": n / args.reps, "share": us / total}
                 for name, (us, n) in kernels.items()), key=lambda r: -r["ms_per_step"])
  result = {**point_fields(args), "k_max": k_max,
            "variant": args.variant, "backend": args.backend, "reps": args.reps,
            "device": jax.devices()[0].device_kind,
            "kernel_ms_per_step": total / args.reps / 1e3, "rows": rows,
            "step_span_ms": span / 1e3, "step_idle_ms": idle / 1e3,
            "gating_span_ms": gate_span / 1e3, "gating_idle_ms": gate_idle / 1e3,
            "host_events_ms_per_step": [(n, us / args.reps / 1e3, c / args.reps)
                                        for n, us, c in host],
            "gating_host_events_ms_per_step": [(n, us / args.reps / 1e3, c / args.reps)
                                               for n, us, c in gate_host],
            "gating_kernel_ms": gate_total / args.reps / 1e3, "gating_share": gate_total / total,
            "gating_rows": {n: us / args.reps / 1e3 for n, (us, _) in gate_kernels.items()},
            "thread_ms_per_step": {t: us / args.reps / 1e3 for t, us in per_thread.items()}}
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  print(f"{args.heads} S={args.seq} block {args.block} k={args.k} (k_max {k_max}): kernels "
        f"{result['kernel_ms_per_step']:.3f} ms per fwd+bwd step; gating alone "
        f"{result['gating_kernel_ms']:.3f} ms ({100 * result['gating_share']:.1f}%)")
  print(f"  GPU span per step {span / 1e3:.3f} ms, of it idle (waiting for launches) "
        f"{idle / 1e3:.3f} ms; gating alone: span {gate_span / 1e3:.3f}, idle "
        f"{gate_idle / 1e3:.3f} ms")
  for r in rows:
    print(f"  {r['ms_per_step']:7.3f} ms {100 * r['share']:5.1f}%  x{r['launches_per_step']:g}  "
          f"{r['kernel'][:90]}")
  for title, events in (("step", result["host_events_ms_per_step"]),
                        ("gating alone", result["gating_host_events_ms_per_step"])):
    print(f"host events per {title} call (ms, count):")
    for name, ms, count in events:
      print(f"  {ms:7.3f}  x{count:g}  {name[:90]}")


if __name__ == "__main__":
  main()
