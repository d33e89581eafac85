"""Where the Hopper kernels' warpgroups spend their cycles: each Mosaic GPU kernel (forward,
dq, dk/dv) run once at one attention shape with Mosaic GPU's on-chip profiler
(hopper.profile_kernels), which records the named regions of the kernel bodies per
warpgroup; the first items of every CTA are captured (the buffer lives in the shared memory
the kernel leaves free). GPU only.

    python experiments/profile_hopper.py --heads h128 --block 512 --k 3 --out $OUT/prof.json

Prints, per kernel and warpgroup role, the mean cycles per work item spent in each region
and outside all of them ("other": issuing wgmma, loop and address work), from SM clock
cycles (`%clock`); shares are of the captured span. Regions: forward - take_wait_rows (wait
for the item's gathered rows), take_wait_store (for the last output's store to have read the
q tile), take_rows (move the rows into the wgmma tiles), wait_kv, turn (with pingpong: wait
for this warpgroup's turn on the tensor cores), qk_wait (QK^T's completion), softmax, pv (a
PV in a turn of its own, issued and waited for; with overlap=True only an item's last, the
others' waits are pv_wait), epilogue; dq - the three take_ regions (its take_rows moves dO only,
presorted q having come straight into its tile), release_wait_store (for the last item's output
store to have read the tiles it frees), wait_kv, turn, products_wait, ds, dq_mma and
dq_wait (as pv and pv_wait; dq's default at head_dim 128 is the overlap), epilogue; dk/dv -
wait_kv, wait_chunk, turn, products_wait, ds, dkdv_mma, epilogue; the streaming warpgroups -
their waits for free slots (wait_k_free, wait_v_free, wait_rows_free, wait_kv_free,
wait_chunk_free) and the row gather.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import add_point_args, kernel_point, point_fields  # noqa: E402
from pallas_kernels.moba import MobaBlockSizes, hopper  # noqa: E402

# Regions that end a work item, per kernel: their count is the number of items captured.
_ITEM_END = "epilogue"


def summarize(trace: dict, warpgroups: int) -> dict:
  """{role: {"items": mean items per CTA, "span": mean cycles per item, region: mean cycles
  per item, "other": the rest}} over the CTAs of one kernel's trace: a role's cycles summed over
  its CTAs divided by its items summed over them (per CTA where it captured no item). A trace's
  tid is 1 + wg + warpgroups * cta."""
  per_trace: dict[int, list] = collections.defaultdict(list)
  for e in trace["traceEvents"]:
    per_trace[e["tid"]].append(e)
  roles: dict[int, list] = collections.defaultdict(list)
  for tid, events in per_trace.items():
    events.sort(key=lambda e: e["ts"])
    stack, totals = [], collections.defaultdict(float)
    for e in events:
      if e["ph"] == "B":
        stack.append(e)
      elif stack:
        b = stack.pop()
        if not stack:  # top-level regions only: nested ones are inside their parent's time
          totals[b["name"]] += (e["ts"] - b["ts"]) * 1e3  # ts: cycles / 1e3
    span = (events[-1]["ts"] - events[0]["ts"]) * 1e3
    roles[(tid - 1) % warpgroups].append((span, totals, sum(
        1 for e in events if e["ph"] == "E" and e["name"] == _ITEM_END)))
  out = {}
  for role, rows in sorted(roles.items()):
    items = np.mean([n for _, _, n in rows])
    names = sorted({name for _, totals, _ in rows for name in totals})
    per_item = items if items > 0 else 1.0
    summary = {"traces": len(rows), "items": float(items),
               "span": float(np.mean([s for s, _, _ in rows])) / per_item}
    for name in names:
      summary[name] = float(np.mean([totals.get(name, 0.0) for _, totals, _ in rows])) / per_item
    summary["other"] = summary["span"] - sum(summary[n] for n in names)
    out[f"wg{role}"] = summary
  return out


def profiled(fn, args, directory, events, warpgroups):
  """Runs fn (a function building a Hopper kernel call) once, built under
  hopper.profile_kernels, and returns the summary of the trace it writes."""
  os.makedirs(directory, exist_ok=True)
  with hopper.profile_kernels(directory, events):
    jax.block_until_ready(jax.jit(fn)(*args))
  jax.effects_barrier()  # the trace is written by a host callback
  files = sorted(glob.glob(os.path.join(directory, "*trace.json")))
  if len(files) != 1:
    raise RuntimeError(f"expected one profile trace in {directory}, found {files}")
  with open(files[0]) as f:
    return summarize(json.load(f), warpgroups)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--events", type=int, default=300,
                 help="regions recorded per warpgroup (16 bytes each of shared memory)")
  p.add_argument("--dq-config", default="64,2",
                 help="block_kv,stages[,V stages] of the dq kernel (its default at head_dim "
                      "128, 64,3,2, leaves too little shared memory for 300 events)")
  p.add_argument("--forward-schedule", default=None,
                 help="overlap,pingpong (0 or 1 each) of the forward kernel; default: its "
                      "defaults for the head_dim")
  p.add_argument("--kernels", nargs="+", default=["forward", "dq", "dkv"],
                 choices=["forward", "dq", "dkv"])
  p.add_argument("--plain", action="store_true",
                 help="run each kernel once without the profiler and stop (for an outside "
                      "profiler such as Nsight Compute)")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  t, block = args.seq, args.block
  d, k, v, seg, layout, q_flat, do_flat, lse, delta = kernel_point(args)
  lay = layout(hopper.ITEM_ROWS)
  bs = MobaBlockSizes().fit(block, d)
  q_rows = hopper.gather_rows(q_flat, lay, False)
  do_rows = hopper.gather_rows(do_flat, lay, False)
  dq_bkv, *dq_stages = (int(x) for x in args.dq_config.split(","))
  dq_stages = dq_stages[0] if len(dq_stages) == 1 else tuple(dq_stages)
  schedule = {}
  if args.forward_schedule:
    overlap, pingpong = (bool(int(x)) for x in args.forward_schedule.split(","))
    schedule = dict(overlap=overlap, pingpong=pingpong)
  kernels = {
      "forward": (lambda q_flat, k, v: hopper.moba_forward_rows(
          q_flat, lay, k, v, seg, block_size=block, bs=bs, interpret=False, sorted_q=True,
          **schedule),
          (q_flat, k, v), 4),
      "dq": (lambda q_rows, do_rows, lse, delta, k, v: hopper.moba_dq_rows(
          None, None, lse, delta, lay, k, v, seg, block_size=block, bs=bs, interpret=False,
          block_kv=dq_bkv, stages=dq_stages, q_rows=q_rows, do_rows=do_rows),
          (q_rows, do_rows, lse, delta, k, v), 4),
      "dkv": (lambda q_rows, do_rows, lse, delta, k, v: hopper.moba_dkv(
          None, None, lse, delta, lay, k, v, seg, block_size=block, bs=bs, interpret=False,
          q_rows=q_rows, do_rows=do_rows),
          (q_rows, do_rows, lse, delta, k, v), 3),
  }
  kernels = {name: kernels[name] for name in args.kernels}
  if args.plain:
    for name, (fn, fn_args, _) in kernels.items():
      jax.block_until_ready(jax.jit(fn)(*fn_args))
      print(f"ran {name}", flush=True)
    return
  if not args.out:
    p.error("--out is required unless --plain")
  result = dict(device=jax.devices()[0].device_kind, **point_fields(args), events=args.events,
                dq_config=args.dq_config, forward_schedule=args.forward_schedule, kernels={})
  root = tempfile.mkdtemp(prefix="moba_profile_")
  for name, (fn, fn_args, wgs) in kernels.items():
    try:
      result["kernels"][name] = profiled(fn, fn_args, os.path.join(root, name), args.events,
                                         wgs)
    except Exception as e:  # one kernel that does not fit the profiler is reported, not fatal
      result["kernels"][name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"\ncycles per work item (SM clock), {args.heads} S={t} block {block} k={args.k}")
  for name, roles in result["kernels"].items():
    if "error" in roles:
      print(f"{name}: {roles['error']}")
      continue
    for role, s in roles.items():
      regions = " ".join(f"{n}={v:.0f}" for n, v in s.items()
                         if n not in ("traces", "items", "span"))
      print(f"{name:8s} {role}: {s['items']:.1f} items/CTA, {s['span']:.0f} per item: {regions}")


if __name__ == "__main__":
  main()
