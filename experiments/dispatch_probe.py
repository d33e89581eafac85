"""Where a MoBA call's wall time goes past its GPU time: the host's dispatch, and whether calls
issued back to back keep the GPU busy.

    PYTHONUNBUFFERED=1 python3 experiments/dispatch_probe.py --backend mosaic \\
        --out $OUT/dispatch.json

For a trivial jitted call, the gating alone, the forward and the forward+backward step at one
point (add_point_args), it times a synchronised call (timing.time_call, the project's rule)
and back-to-back calls (timing.time_pipelined). Then it traces --calls back-to-back steps
under `jax.profiler.trace` and reads the GPU's timeline: each step's span, the GPU's idle
time between kernels and between steps, the kernels on either side of the longest gaps, and
the host events that run while the GPU waits - what the GPU waits for - and, traced one
synchronised call at a time, how long a call takes to reach its first kernel and to return
after its last, with the host events of those calls. With --xla-flags variants it reruns
the timings in a fresh process under each XLA_FLAGS value (XLA reads its flags once per
process). With --compare it times, in this one process and interleaved round by round (so
that the GPU's clocks and the process's state drift alike for all), the step under each
--compile-options set (XLA's per-program options, `jax.jit(compiler_options=)`) and the step
with the gating precomputed (its kernels and glue only): what the program's structure, not
the process, costs a synchronised call. With --pipeline-rounds it only compares, round by
round, back-to-back calls of the step and of cuDNN's dense step timed by wall clock untraced
and traced, against the GPU's span and each kernel kind's time in the trace (sustained
back-to-back work runs the GPU at its power limit, at lower clocks than single calls see).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (add_point_args, dense_causal, fwd_bwd,  # noqa: E402
                                      point_fields, point_inputs, step_gating)
from experiments.trace_moba import (_gpu_threads, host_event_times, load_trace,  # noqa: E402
                                    stream_kernels)
from pallas_kernels.moba import MobaBlockSizes, gating, moba_attention  # noqa: E402
from pallas_kernels.moba.attention import BACKENDS, _moba_core, gate_and_layout  # noqa: E402
from sparsebalance_jax.balance.timing import time_call, time_pipelined  # noqa: E402


def _step_loss(out, do):
  """The sum of out * dO: its gradient in (q, k, v) is the forward+backward step."""
  return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))


def _attend(args):
  """The point's attention (q, k, v, seg, budget) -> out, and its step's loss."""
  attend = lambda q, k, v, seg, budget: moba_attention(
      q, k, v, seg, budget, block_size=args.block, k_max=args.k, backend=args.backend,
      interpret=args.interpret)
  loss = lambda q, k, v, do, seg, budget: _step_loss(attend(q, k, v, seg, budget), do)
  return attend, loss


def calls(args):
  """{name: (jitted fn, operands)}: the calls whose dispatch is measured."""
  _, q, k, v, do, seg, budget = point_inputs(args)
  attend, loss = _attend(args)
  gate_fn = jax.jit(lambda q, k, seg, budget: step_gating(
      q, k, seg, budget, block_size=args.block, k_max=args.k, bs=MobaBlockSizes(),
      interpret=args.interpret, backend=args.backend))
  return {"trivial": (jax.jit(lambda x: x + 1), (budget,)),
          "gating": (gate_fn, (q, k, seg, budget)),
          "forward": (jax.jit(attend), (q, k, v, seg, budget)),
          "step": (jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v, do, seg, budget))}


def parse_options(text: str) -> dict:
  """'name=value;name=value' -> XLA compile options (ints where the value is one)."""
  out = {}
  for item in filter(None, text.split(";")):
    name, sep, value = item.partition("=")
    if not sep or not name:
      raise ValueError(f"--compile-options entry {item!r} is not name=value")
    out[name.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
  return out


def compare_calls(args, option_sets: list[str]) -> dict:
  """{label: (jitted fn, operands)}: the step under the default options and each of
  option_sets, and the step on a gating computed beforehand ("kernels only")."""
  d, q, k, v, do, seg, budget = point_inputs(args)
  bs = MobaBlockSizes().fit(args.block, d)
  _, loss = _attend(args)
  out = {}
  for text in ["", *option_sets]:
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), compiler_options=parse_options(text))
    out[f"step [{text}]" if text else "step"] = (fn, (q, k, v, do, seg, budget))
  sel, layout = jax.jit(lambda q, k, seg, budget: gate_and_layout(
      q, k, seg, budget, block_size=args.block, k_max=args.k, bs=bs, interpret=args.interpret,
      backend=args.backend))(q, k, seg, budget)
  ok = gating.check_budget(budget, k_max=args.k)
  core_loss = lambda q, k, v, do, sel, layout: _step_loss(_moba_core(
      q, k, v, seg, ok, sel, layout, args.block, bs, args.interpret, args.backend), do)
  out["kernels only"] = (jax.jit(jax.grad(core_loss, argnums=(0, 1, 2))),
                         (q, k, v, do, sel, layout))
  return out


def interleaved(fns, rounds: int, reps: int) -> dict:
  """Synchronised medians of every call, round by round in turn: per call the median and the
  spread over rounds of the per-round medians, in ms."""
  per = {name: [] for name in fns}
  for fn, operands in fns.values():
    jax.block_until_ready(fn(*operands))  # compile before any timing
  for _ in range(rounds):
    for name, (fn, operands) in fns.items():
      per[name].append(1e3 * time_call(fn, *operands, warmup=1, repeats=reps))
  out = {}
  for name, ms in per.items():
    ms = sorted(ms)
    out[name] = {"median_ms": ms[len(ms) // 2], "min_ms": ms[0], "max_ms": ms[-1],
                 "rounds_ms": per[name]}
    print(f"  {name[:60]:60s} {ms[len(ms) // 2]:7.3f} ms (rounds {ms[0]:.3f}-{ms[-1]:.3f})",
          flush=True)
  return out


def timings(fns, reps: int) -> dict:
  out = {}
  for name, (fn, operands) in fns.items():
    sync = 1e3 * time_call(fn, *operands, warmup=2, repeats=reps)
    pipe = 1e3 * time_pipelined(fn, *operands, calls=20, repeats=3)
    out[name] = {"sync_ms": sync, "pipelined_ms": pipe}
    print(f"  {name:8s} synchronised {sync:7.3f} ms  back to back {pipe:7.3f} ms", flush=True)
  return out


def host_spans(trace: dict) -> list[tuple[float, float, str]]:
  """(start, end, name) in microseconds of the events outside the GPU processes, by start."""
  events = trace["traceEvents"]
  gpu_pids = _gpu_threads(events)[0]
  return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"])
                for e in events if e.get("ph") == "X" and e.get("pid") not in gpu_pids)


def timeline(trace: dict, steps: int, top: int = 12) -> dict:
  """The GPU's stream kernels of `steps` back-to-back steps: span, busy and idle per step, the
  `top` longest idle gaps with the kernels around them and the host events overlapping
  them, and the idle time summed by (kernel before, kernel after)."""
  kernels, host = stream_kernels(trace), host_spans(trace)
  if not kernels:
    raise ValueError("the trace holds no kernels on the GPU's streams")
  gaps, end = [], kernels[0][1]
  busy = kernels[0][1] - kernels[0][0]
  for i in range(1, len(kernels)):
    start, stop, name = kernels[i]
    if start > end:
      gaps.append((start - end, end, start, kernels[i - 1][2], name))
      busy += stop - start
    elif stop > end:
      busy += stop - end
    end = max(end, stop)
  span = end - kernels[0][0]
  by_pair: dict[str, float] = collections.defaultdict(float)
  for gap, _, _, before, after in gaps:
    by_pair[f"{before[:60]} -> {after[:60]}"] += gap
  longest = []
  for gap, lo, hi, before, after in sorted(gaps, reverse=True)[:top]:
    during = collections.Counter(
        name for a, b, name in host if a < hi and b > lo and (b - a) < 0.9 * (hi - lo) + 50)
    longest.append({"gap_us": gap, "before": before, "after": after,
                    "host_events": during.most_common(12)})
  return {"span_ms_per_step": span / steps / 1e3, "busy_ms_per_step": busy / steps / 1e3,
          "idle_ms_per_step": (span - busy) / steps / 1e3, "kernels": len(kernels),
          "idle_us_by_neighbours": dict(sorted(by_pair.items(), key=lambda kv: -kv[1])[:top]),
          "longest_gaps": longest}


def traced_back_to_back(fn, operands, steps: int):
  jax.block_until_ready(fn(*operands))
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir):
      out = None
      for _ in range(steps):
        out = fn(*operands)
      jax.block_until_ready(out)
    return load_trace(log_dir)


def traced_synchronised(fn, operands, calls: int):
  jax.block_until_ready(fn(*operands))
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir):
      for _ in range(calls):
        jax.block_until_ready(fn(*operands))
    return load_trace(log_dir)


def _kernel_kind(name: str) -> str:
  for kind in ("fwd", "dq", "dkv"):
    if f"moba_{kind}_" in name:
      return kind
  return "cudnn" if "cudnn" in name.lower() or "flash" in name.lower() else "xla"


def pipeline_rounds(fns, rounds: int, calls: int) -> dict:
  """Per call in fns and per round, alternating: `calls` back-to-back calls timed by wall
  clock untraced, the same traced (wall clock, and the GPU's span, busy time and kernel time
  per step from the trace, by kernel kind), and a synchronised median of `calls`. Tells
  apart the GPU's time per step from what a back-to-back wall clock adds to it, in one
  process."""
  out = {name: [] for name in fns}
  for fn, operands in fns.values():
    jax.block_until_ready(fn(*operands))
  for r in range(rounds):
    for name, (fn, operands) in fns.items():
      row = {"pipelined_ms": 1e3 * time_pipelined(fn, *operands, calls=calls, repeats=1)}
      with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir):
          start = time.perf_counter()
          res = None
          for _ in range(calls):
            res = fn(*operands)
          jax.block_until_ready(res)
          row["traced_wall_ms"] = 1e3 * (time.perf_counter() - start) / calls
        trace = load_trace(log_dir)
      kernels = stream_kernels(trace)
      if kernels:  # none without a GPU
        tl = timeline(trace, calls)
        row.update({k: tl[k] for k in ("span_ms_per_step", "busy_ms_per_step",
                                       "idle_ms_per_step")})
      by_kind = collections.defaultdict(float)
      for a, b, kname in kernels:
        by_kind[_kernel_kind(kname)] += (b - a) / calls / 1e3
      row["kernel_ms_by_kind"] = dict(by_kind)
      row["sync_ms"] = 1e3 * time_call(fn, *operands, warmup=1, repeats=calls)
      out[name].append(row)
      nan = float("nan")
      print(f"  round {r} {name:6s} back to back {row['pipelined_ms']:7.3f} ms/call, traced "
            f"{row['traced_wall_ms']:7.3f} (GPU span {row.get('span_ms_per_step', nan):.3f}, "
            f"busy {row.get('busy_ms_per_step', nan):.3f}, idle "
            f"{row.get('idle_ms_per_step', nan):.3f}; kernels "
            + ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_kind.items()))
            + f"), synchronised {row['sync_ms']:7.3f}", flush=True)
  return out


def sync_phases(trace: dict) -> dict:
  """Each synchronised call cut in three on the trace's one clock: from the jitted call's
  start on the host to its first kernel's start on the GPU (dispatch), the GPU's span, and
  from the last kernel's end to block_until_ready's return (the wait's wake-up); medians
  over the traced calls, in ms."""
  kernels = [(start, end) for start, end, _ in stream_kernels(trace)]
  spans = host_spans(trace)
  host = lambda pred: [(start, end) for start, end, name in spans if pred(name)]
  outer, end = [], -1.0
  for a, b in host(lambda n: n.startswith("PjitFunction")):
    if a >= end:  # not nested in the last call's event
      outer.append((a, b))
      end = b
  waits = host(lambda n: "block_until_ready" in n)
  phases = collections.defaultdict(list)
  for a, _ in outer:
    done = next((b for w, b in waits if w >= a), None)
    inside = [k for k in kernels if a <= k[0] and (done is None or k[1] <= done)]
    if done is None or not inside:
      continue
    first, last = inside[0][0], max(k[1] for k in inside)
    for name, us in (("dispatch", first - a), ("gpu_span", last - first),
                     ("wake_up", done - last), ("call", done - a)):
      phases[name].append(us / 1e3)
  return {name: sorted(v)[len(v) // 2] for name, v in phases.items()} | {"calls": len(outer)}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--backend", default="mosaic", choices=sorted(BACKENDS))
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--calls", type=int, default=8, help="back-to-back steps traced")
  p.add_argument("--xla-flags", action="append", default=[], metavar="FLAGS",
                 help="an XLA_FLAGS value to time in a fresh process; repeat for more "
                      "(--xla-flags=--xla_gpu_enable_command_buffer= ; '' for none)")
  p.add_argument("--compare", action="store_true",
                 help="only the in-process comparison: the step under each --compile-options "
                      "set and on a precomputed gating, interleaved")
  p.add_argument("--compile-options", action="append", default=[], metavar="OPTS",
                 help="XLA compile options for --compare, 'name=value;name=value' (e.g. "
                      "xla_gpu_graph_min_graph_size=100000); repeat for more sets")
  p.add_argument("--rounds", type=int, default=7, help="--compare's rounds")
  p.add_argument("--pipeline-rounds", type=int, default=0, metavar="N",
                 help="only N alternating rounds of back-to-back calls of the step and of "
                      "cuDNN's, untraced and traced (wall clock against the GPU's span)")
  p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU smoke)")
  p.add_argument("--timings-only", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  if args.compare:
    print(f"synchronised, {args.rounds} interleaved rounds of {args.reps} calls:", flush=True)
    result = {"compare": interleaved(compare_calls(args, args.compile_options), args.rounds,
                                     args.reps)}
    if args.out:
      with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return
  if args.pipeline_rounds:
    print(f"{args.pipeline_rounds} rounds of {args.calls} calls back to back:", flush=True)
    fns = {"step": calls(args)["step"]}
    if not args.interpret:
      _, q, k, v, do, _, _ = point_inputs(args)
      fns["cudnn"] = (fwd_bwd(dense_causal(False)), (q, k, v, do))
    result = {"pipeline_rounds": pipeline_rounds(fns, args.pipeline_rounds, args.calls)}
    if args.out:
      with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return
  fns = calls(args)
  result = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "timings": timings(fns, args.reps)}
  if not args.timings_only and jax.default_backend() != "gpu":
    print("no GPU: the back-to-back timeline (GPU kernels) is left out", flush=True)
  elif not args.timings_only:
    fn, operands = fns["step"]
    trace = traced_back_to_back(fn, operands, args.calls)
    result["back_to_back"] = timeline(trace, args.calls)
    result["host_totals_us"] = host_event_times(trace, 40)
    tl = result["back_to_back"]
    print(f"back to back, {args.calls} traced steps: span {tl['span_ms_per_step']:.3f} ms per "
          f"step, busy {tl['busy_ms_per_step']:.3f}, idle {tl['idle_ms_per_step']:.3f}")
    for pair, us in tl["idle_us_by_neighbours"].items():
      print(f"  idle {us / args.calls:8.1f} us/step  {pair}")
    for g in tl["longest_gaps"][:6]:
      print(f"  gap {g['gap_us']:7.1f} us  {g['before'][:40]} -> {g['after'][:40]}: "
            + ", ".join(f"{n[:40]} x{c}" for n, c in g["host_events"][:6]))
    sync_trace = traced_synchronised(fn, operands, args.calls)
    phases = sync_phases(sync_trace)
    result["synchronised_phases_ms"] = phases
    result["synchronised_host_totals_us"] = host_event_times(sync_trace, 40)
    print(f"synchronised, {phases['calls']} traced calls (medians): dispatch "
          f"{phases.get('dispatch', float('nan')):.3f} ms to the first kernel, GPU span "
          f"{phases.get('gpu_span', float('nan')):.3f}, wake-up "
          f"{phases.get('wake_up', float('nan')):.3f}, call {phases.get('call', float('nan')):.3f}")
    print("host events in the traced back-to-back steps (us total, count):")
    for name, us, count in result["host_totals_us"]:
      print(f"  {us:9.1f}  x{count:<4d} {name[:100]}")
    print("host events in the traced synchronised calls (us total, count):")
    for name, us, count in result["synchronised_host_totals_us"][:25]:
      print(f"  {us:9.1f}  x{count:<4d} {name[:100]}")
  variants = {}
  for flags in args.xla_flags:
    env = dict(os.environ, XLA_FLAGS=flags)
    with tempfile.TemporaryDirectory() as tmp:
      cmd = [sys.executable, __file__, "--timings-only", "--backend", args.backend, "--reps",
             str(args.reps), "--out", os.path.join(tmp, "t.json")]
      cmd += [arg for key, value in point_fields(args).items() for arg in (f"--{key}", str(value))]
      cmd += ["--interpret"] if args.interpret else []
      run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
      print(run.stdout, flush=True)
      if run.returncode != 0:
        print(f"XLA_FLAGS={flags!r}: exit {run.returncode}\n{run.stderr[-3000:]}", flush=True)
        variants[flags] = {"error": run.stderr[-3000:]}
        continue
      with open(os.path.join(tmp, "t.json")) as f:
        variants[flags] = json.load(f)["timings"]
  result["variants"] = variants
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
