"""The straggler benchmark's report: a PNG of per-shard times and budgets, and a markdown table.

Owns the presentation of `balance.simulate.run_workload` results (one dict per workload):

- `write_png`: per workload, one column per row (method): the shards' measured times over the
  steps (one line per shard, the step's max drawn thick) and their budgets; at the bottom, per
  workload and row, bars of the imbalance predicted at the base budget (before tuning), predicted
  at the chosen budgets (after) and measured.
- `markdown_table`: one line per (workload, row) with the summary numbers. "tuner ms (%)" is
  the whole decision a DST row pays before each step (host work and the coverage probe, as
  `balance.simulate` charges it; the percentage is of the step, which includes it), "probe ms"
  the probe's part.
- `decision_table`: the columns the decision changes (step, speedup, tuner overhead, probe),
  for chosen rows: what `experiments/bench_balance.py --recount` prints.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

TABLE_COLUMNS = ("workload", "row", "steps", "imbalance", "step ms", "speedup", "tuner ms (%)",
                 "probe ms", "compiles / buckets", "mean budget", "mean coverage", "pred. err")
DECISION_COLUMNS = ("workload", "row", "step ms", "speedup", "tuner ms (%)", "probe ms")


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


def _cells(s: Mapping[str, Any]) -> dict[str, str]:
    """Every column's text for one row's summary."""
    return {"steps": str(s["steps"]), "imbalance": f"{s['imbalance']:.3f}",
            "step ms": f"{1e3 * s['mean_step_seconds']:.1f}", "speedup": f"{s['speedup']:.3f}",
            "tuner ms (%)": f"{s['tuner_ms']:.2f} ({s['tuner_pct']:.2f}%)",
            "probe ms": f"{s['coverage_ms']:.2f}",
            "compiles / buckets": f"{s['compiles']} / {s['buckets']}",
            "mean budget": f"{s['mean_budget']:.2f}", "mean coverage": f"{s['mean_coverage']:.3f}",
            "pred. err": f"{s['prediction_error']:.3f}"}


def _table(results: Mapping[str, Mapping[str, Any]], columns: Sequence[str],
           rows: Sequence[str] | None) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, workload in results.items():
        for method, row in workload["rows"].items():
            if rows is None or method in rows:
                cells = dict(_cells(row["summary"]), workload=name, row=method)
                lines.append("| " + " | ".join(cells[c] for c in columns) + " |")
    return "\n".join(lines)


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    return _table(results, TABLE_COLUMNS, None)


def decision_table(results: Mapping[str, Mapping[str, Any]], rows: Sequence[str]) -> str:
    return _table(results, DECISION_COLUMNS, rows)
