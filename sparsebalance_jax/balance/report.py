"""The straggler benchmark's report: a PNG of per-shard times and budgets, and a markdown table.

Owns the presentation of `balance.simulate.run_workload` results (one dict per workload):

- `write_png`: per workload, one column per row (method): the shards' measured times over the
  steps (one line per shard, the step's max drawn thick) and their budgets; at the bottom, per
  workload and row, bars of the imbalance predicted at the base budget (before tuning), predicted
  at the chosen budgets (after) and measured.
- `markdown_table`: one line per (workload, row) with the summary numbers.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

TABLE_COLUMNS = ("workload", "row", "steps", "imbalance", "step ms", "speedup", "tuner ms (%)",
                 "compiles / buckets", "mean budget", "mean coverage", "pred. err")


def write_png(path: str, results: Mapping[str, Mapping[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # Files only; no display on the benchmark machines.
    import matplotlib.pyplot as plt

    workloads = list(results)
    methods = list(results[workloads[0]]["rows"])
    fig = plt.figure(figsize=(4.2 * len(methods), 3.0 * (2 * len(workloads) + 1)))
    grid = fig.add_gridspec(2 * len(workloads) + 1, len(methods))
    for w, name in enumerate(workloads):
        for c, method in enumerate(methods):
            steps = results[name]["rows"][method]["steps"]
            t = np.arange(1, len(steps) + 1)
            measured_TS = 1e3 * np.array([r["measured_S"] for r in steps])
            budgets_TS = np.array([r["budgets_S"] for r in steps])
            ax = fig.add_subplot(grid[2 * w, c])
            ax.plot(t, measured_TS, lw=0.8, alpha=0.7)
            ax.plot(t, measured_TS.max(axis=1), "k-", lw=2, label="max (step)")
            ax.set_title(f"{name} / {method}", fontsize=9)
            ax.set_ylabel("shard ms")
            ax.set_xticks(t)
            ax.legend(fontsize=7)
            ax = fig.add_subplot(grid[2 * w + 1, c])
            ax.plot(t, budgets_TS, lw=0.8, marker=".")
            ax.set_ylabel("shard budget k")
            ax.set_xticks(t)
            ax.set_xlabel("step")
    ax = fig.add_subplot(grid[-1, :])
    width = 0.27
    keys = (("predicted_imbalance_before", "predicted, base budget"),
            ("predicted_imbalance_after", "predicted, chosen budgets"),
            ("imbalance", "measured"))
    x = np.arange(len(workloads) * len(methods))
    for i, (key, label) in enumerate(keys):
        values = [results[n]["rows"][m]["summary"][key] for n in workloads for m in methods]
        ax.bar(x + (i - 1) * width, values, width, label=label)
    labels = [f"{n}\n{m}" for n in workloads for m in methods]
    ax.set_xticks(x, labels, fontsize=7)
    low = min(results[n]["rows"][m]["summary"][k] for n in workloads for m in methods
              for k, _ in keys)
    ax.set_ylim(bottom=min(1.0, low) - 0.02)  # Imbalance is >= 1: show the differences.
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_ylabel("imbalance (max/mean)")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for name, workload in results.items():
        for method, row in workload["rows"].items():
            s = row["summary"]
            cells = (name, method, str(s["steps"]), f"{s['imbalance']:.3f}",
                     f"{1e3 * s['mean_step_seconds']:.1f}", f"{s['speedup']:.3f}",
                     f"{s['tuner_ms']:.2f} ({s['tuner_pct']:.2f}%)",
                     f"{s['compiles']} / {s['buckets']}", f"{s['mean_budget']:.2f}",
                     f"{s['mean_coverage']:.3f}", f"{s['prediction_error']:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
