"""One line per trace_moba.py JSON given: the step's kernel time, its GPU span and idle part,
and the forward, dq, dk/dv and gate top-k kernels' time, with the gating's own (ms per step).

    python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
"""

import json
import os
import sys

KERNELS = {"forward": "moba_fwd", "dq": "moba_dq", "dk/dv": "moba_dkv", "gate": "moba_gate_topk"}


def kernel_times(trace: dict) -> dict[str, float]:
  """ms per step of each of KERNELS in a trace_moba.py JSON (summed over the kernels whose
  names hold its mark)."""
  return {k: sum(r["ms_per_step"] for r in trace["rows"] if m in r["kernel"])
          for k, m in KERNELS.items()}


def main(paths):
  for path in paths:
    if not os.path.exists(path):  # an unmatched glob, or a run that wrote nothing
      continue
    d = json.load(open(path))
    times = kernel_times(d)
    name = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
    print(f"{name:34s} kernels {d['kernel_ms_per_step']:.3f} span {d['step_span_ms']:.3f} "
          f"idle {d['step_idle_ms']:.3f} "
          + " ".join(f"{k} {v:.3f}" for k, v in times.items())
          + f" gating {d['gating_kernel_ms']:.3f}")


if __name__ == "__main__":
  main(sys.argv[1:])
