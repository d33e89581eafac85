"""The accuracy study: train and evaluate every (method, seed) arm, then one comparison table.

An arm is one `experiments.train` run of `configs/accuracy_study.py:<method>` with
`train.seed = data.seed = seed`, then one `experiments.eval` of its final checkpoint
(teacher-forced: held-out text loss and the synthetic suite). Arms run as subprocesses, up to
`parallel` at once: on a GPU host several small runs share the devices (the study measures
accuracy, not speed, so sharing changes no result); each arm's log is `<workdir>/train.log`
and `<workdir>/eval.log`, and a failed arm fails the study with its log's tail.

The table (`summarize_arms`) has one row per arm and one mean row per method with the spread
between seeds (half the range, so two seeds give mean +- half their difference):
final training loss (mean of the last `tail` logged steps), held-out text NLL, mean answer NLL
over the suite, and the suite's exact-match accuracy per task and overall.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
from typing import Sequence

import numpy as np

from sparsebalance_jax.config import ConfigError
from sparsebalance_jax.jsonfile import write_json, write_text
from sparsebalance_jax.training.metrics import read_metrics

CONFIG = "configs/accuracy_study.py"


@dataclasses.dataclass(frozen=True)
class Arm:
    method: str
    seed: int
    workdir: str

    @property
    def name(self) -> str:
        return f"{self.method}-seed{self.seed}"


@dataclasses.dataclass(frozen=True)
class StudySettings:
    preset: str  # "gpu", "cpu" or "auto" (configs/longbench.py's rule)
    steps: int | None  # overrides train.num_steps when given
    suite_lengths: tuple[int, ...]  # synthetic suite lengths in characters; () = harness default
    suite_per_cell: int
    text_per_cell: int
    eval_batch_size: int


def plan_arms(methods: Sequence[str], seeds: Sequence[int], out_dir: str) -> list[Arm]:
    return [Arm(m, s, os.path.join(out_dir, f"{m}-seed{s}")) for s in seeds for m in methods]


def _config_flags(arm: Arm, settings: StudySettings) -> list[str]:
    flags = [f"--config={CONFIG}:{arm.method},{settings.preset}",
             f"--config.train.seed={arm.seed}", f"--config.data.seed={arm.seed}",
             f"--config.train.workdir={arm.workdir}"]
    if settings.steps is not None:
        flags.append(f"--config.train.num_steps={settings.steps}")
    return flags


def arm_commands(arm: Arm, settings: StudySettings) -> tuple[list[str], list[str]]:
    """The train and eval command lines of one arm."""
    config = _config_flags(arm, settings)
    train = [sys.executable, "-m", "experiments.train", *config]
    evaluate = [sys.executable, "-m", "experiments.eval", *config, f"--checkpoint={arm.workdir}",
                f"--output={os.path.join(arm.workdir, 'eval.json')}",
                f"--suite_per_cell={settings.suite_per_cell}",
                f"--text_per_cell={settings.text_per_cell}",
                f"--batch_size={settings.eval_batch_size}"]
    if settings.suite_lengths:
        evaluate.append("--suite_lengths=" + ",".join(str(n) for n in settings.suite_lengths))
    return train, evaluate


def _run_logged(cmd: list[str], log_path: str, env: dict[str, str]) -> None:
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if code:
        with open(log_path) as f:
            tail = "".join(f.readlines()[-30:])
        raise RuntimeError(f"{os.path.basename(log_path)} of {os.path.dirname(log_path)} "
                           f"exited with {code}; its last lines:\n{tail}")


def run_arm(arm: Arm, settings: StudySettings, env: dict[str, str]) -> Arm:
    """Trains (resuming a partial run; a finished run only restores) and evaluates one arm."""
    os.makedirs(arm.workdir, exist_ok=True)
    train, evaluate = arm_commands(arm, settings)
    _run_logged(train, os.path.join(arm.workdir, "train.log"), env)
    _run_logged(evaluate, os.path.join(arm.workdir, "eval.log"), env)
    return arm


def run_study(arms: Sequence[Arm], settings: StudySettings, *, parallel: int,
              env: dict[str, str] | None = None) -> None:
    env = dict(os.environ if env is None else env)
    # Arms sharing a GPU must not each reserve most of its memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(run_arm, arm, settings, env) for arm in arms]
        for done in concurrent.futures.as_completed(futures):
            print(f"finished {done.result().name}", flush=True)


def arm_result(arm: Arm, *, tail: int = 50) -> dict:
    """One arm's numbers from its metrics.jsonl and eval.json."""
    metrics = read_metrics(arm.workdir)
    last_steps = sorted(metrics)[-tail:]
    with open(os.path.join(arm.workdir, "eval.json")) as f:
        evaluation = json.load(f)
    overall = {(r["suite"], r["task"]): r for r in evaluation["rows"] if r["bucket"] == "all"}
    tasks = sorted(t for s, t in overall if s == "synthetic")
    if ("text", "heldout_wiki") not in overall or not tasks:
        raise ValueError(f"{arm.workdir}/eval.json lacks the held-out text or synthetic rows")
    synthetic = [e for e in evaluation["examples"] if e["suite"] == "synthetic"]
    budgets = np.array([v for rec in metrics.values() for k, v in rec.items()
                        if k.startswith("budget/shard")])
    return {
        "method": arm.method, "seed": arm.seed, "steps": max(metrics),
        "train_loss": float(np.mean([metrics[s]["loss"] for s in last_steps])),
        "text_nll": overall[("text", "heldout_wiki")]["nll"],
        "answer_nll": float(np.mean([e["nll"] for e in synthetic])),
        "accuracy": {t: overall[("synthetic", t)]["score"] for t in tasks},
        "suite_accuracy": 100.0 * float(np.mean([e["score"] for e in synthetic])),
        # Budgets the arm's rows carried (the base budget when DST is off; dense ignores it),
        # and the share of (step, shard) budgets DST moved off the base: with two shards and
        # the mean anchor, moves can cancel in the mean.
        "mean_budget": float(np.mean(budgets)),
        "moved_share": float(np.mean(budgets != evaluation["settings"]["budget"])),
    }


def summarize_arms(results: Sequence[dict]) -> list[dict]:
    """Per method (in first-seen order): the mean and half-range over seeds of each number."""
    methods = list(dict.fromkeys(r["method"] for r in results))
    rows = []
    for method in methods:
        rs = [r for r in results if r["method"] == method]
        row = {"method": method, "seeds": [r["seed"] for r in rs]}
        for key in ("train_loss", "text_nll", "answer_nll", "suite_accuracy"):
            vals = np.array([r[key] for r in rs])
            row[key] = (float(vals.mean()), float(np.ptp(vals) / 2))
        row["accuracy"] = {t: (float(np.mean([r["accuracy"][t] for r in rs])),
                               float(np.ptp([r["accuracy"][t] for r in rs]) / 2))
                           for t in rs[0]["accuracy"]}
        rows.append(row)
    return rows


def _percent(share: float | None) -> str:
    # Reports written before the moved share was recorded have none.
    return "-" if share is None else f"{100 * share:.0f}%"


def format_markdown(results: Sequence[dict], summary: Sequence[dict]) -> str:
    tasks = list(results[0]["accuracy"])
    head = ("| method | seed | steps | train loss | held-out text NLL | answer NLL | "
            + " | ".join(tasks) + " | suite acc. | mean budget | budgets moved |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(f"| {r['method']} | {r['seed']} | {r['steps']} | {r['train_loss']:.3f} | "
                     f"{r['text_nll']:.3f} | {r['answer_nll']:.3f} | "
                     + " | ".join(f"{r['accuracy'][t]:.1f}" for t in tasks)
                     + f" | {r['suite_accuracy']:.1f} | {r['mean_budget']:.2f} | "
                     f"{_percent(r.get('moved_share'))} |")

    def pm(v, digits):
        return f"{v[0]:.{digits}f} +- {v[1]:.{digits}f}"

    for s in summary:
        lines.append(f"| **{s['method']}** (mean +- half-range) | {len(s['seeds'])} seeds | | "
                     f"{pm(s['train_loss'], 3)} | {pm(s['text_nll'], 3)} | "
                     f"{pm(s['answer_nll'], 3)} | "
                     + " | ".join(pm(s["accuracy"][t], 1) for t in tasks)
                     + f" | {pm(s['suite_accuracy'], 1)} | | |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: str, arms: Sequence[Arm], meta: dict) -> tuple[str, str]:
    return write_results(out_dir, [arm_result(a) for a in arms], meta)


def combine_reports(paths: Sequence[str]) -> tuple[list[dict], dict]:
    """The arms of several study.json files (e.g. one seed per device call) as one study.
    An arm (method, seed) present in two files is an error; so are reports with different
    settings (steps, suite), which would not be comparable."""
    results, seen, settings = [], {}, None
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if settings is None:
            settings = report["settings"]
        elif report["settings"] != settings:
            raise ConfigError(f"--combine: {path}: settings {report['settings']} differ from "
                             f"{paths[0]}'s {settings}")
        for r in report["arms"]:
            key = (r["method"], r["seed"])
            if key in seen:
                raise ConfigError(f"--combine: arm {key} is in both {seen[key]} and {path}")
            seen[key] = path
            results.append(r)
    return results, {"settings": settings, "combined_from": list(paths)}


def write_results(out_dir: str, results: Sequence[dict], meta: dict) -> tuple[str, str]:
    summary = summarize_arms(results)
    json_path = os.path.join(out_dir, "study.json")
    md_path = os.path.join(out_dir, "study.md")
    write_json(json_path, {**meta, "arms": results, "summary": summary}, indent=1)
    write_text(md_path, format_markdown(results, summary))
    return json_path, md_path
