"""Accuracy study: arm configs differ only in attention and balancing; the table's numbers
come from each arm's metrics.jsonl and eval.json."""

import json
import os
import sys

import numpy as np
import pytest

from configs import accuracy_study
from sparsebalance_jax.balance.tuner import budget_bounds
from sparsebalance_jax.config import ConfigError, from_config_dict
from sparsebalance_jax.eval import harness, study


@pytest.mark.parametrize("preset", ["gpu", "cpu"], ids=["gpu_shape", "cpu_shape"])
def test_arms_differ_only_in_attention_and_balancing(preset):
    raws = {m: accuracy_study.get_config(f"{m},{preset}").to_dict()
            for m in accuracy_study.METHODS}
    cfgs = {m: from_config_dict(r) for m, r in raws.items()}
    assert cfgs["dense"].attention.implementation == ("cudnn" if preset == "gpu" else "reference")
    assert cfgs["moba"].attention.implementation == "moba"
    assert (cfgs["sparsebalance"].data.batcher, cfgs["sparsebalance"].balance.dst) == ("sab", True)
    assert (cfgs["moba"].data.batcher, cfgs["moba"].balance.dst) == ("lbb", False)
    for m, raw in raws.items():
        other = dict(raw)
        for section, keys in (("attention", ["implementation"]), ("data", ["batcher"]),
                              ("balance", ["dst", "shard_timing"]), ("train", ["workdir"])):
            other[section] = {k: v for k, v in raw[section].items() if k not in keys}
        base = dict(raws["moba"])
        for section in ("attention", "data", "balance", "train"):
            base[section] = {k: v for k, v in base[section].items() if k in other[section]}
        assert other == base, m
    assert cfgs["moba"].num_data_shards == 2  # DST needs shards to balance
    assert cfgs["sparsebalance"].balance.shard_timing == (preset == "gpu")
    sb = cfgs["sparsebalance"]
    lo, hi = budget_bounds(sb.attention.budget, sb.balance.p, sb.k_max)
    assert lo < sb.attention.budget < hi  # DST can lower stragglers and raise light shards


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="method: 'sparse'"):
        accuracy_study.get_config("sparse")


def _fake_arm(tmp_path, method, seed, losses, text_nll, scores):
    arm = study.Arm(method, seed, str(tmp_path / f"{method}-seed{seed}"))
    os.makedirs(arm.workdir)
    with open(os.path.join(arm.workdir, "metrics.jsonl"), "w") as f:
        for step, loss in enumerate(losses, 1):
            f.write(json.dumps({"step": step, "loss": loss, "budget/shard0": 3.0,
                                "budget/shard1": 5.0}) + "\n")
    examples = [{"suite": "synthetic", "task": t, "bucket": "800", "score": s, "nll": 1.0 - s,
                 "prediction": None} for t, ss in scores.items() for s in ss]
    rows = [{"suite": "synthetic", "task": t, "bucket": "all", "n": len(ss),
             "score": 100.0 * sum(ss) / len(ss), "nll": None} for t, ss in scores.items()]
    rows.append({"suite": "text", "task": "heldout_wiki", "bucket": "all", "n": 2, "score": 40.0,
                 "nll": text_nll})
    with open(os.path.join(arm.workdir, "eval.json"), "w") as f:
        json.dump({"rows": rows, "examples": examples, "settings": {"budget": 3}}, f)
    return arm


def test_table_numbers_come_from_the_arms(tmp_path):
    arms = [
        _fake_arm(tmp_path, "moba", 0, [9.0] + [2.0] * 50, 1.5,
                  {"needle": [1, 0], "vartrack": [0, 0]}),
        _fake_arm(tmp_path, "moba", 1, [9.0] + [3.0] * 50, 1.7,
                  {"needle": [1, 1], "vartrack": [1, 0]}),
    ]
    results = [study.arm_result(a) for a in arms]
    assert results[0]["train_loss"] == 2.0  # the first (9.0) is outside the last 50 steps
    assert results[0]["accuracy"] == {"needle": 50.0, "vartrack": 0.0}
    assert results[1]["suite_accuracy"] == 75.0 and results[0]["mean_budget"] == 4.0
    assert results[0]["moved_share"] == 0.5  # shard 1 at 5, off the base budget 3
    assert results[0]["answer_nll"] == pytest.approx(0.75)
    (row,) = study.summarize_arms(results)
    assert row["train_loss"] == pytest.approx((2.5, 0.5))
    assert row["text_nll"] == pytest.approx((1.6, 0.1))
    assert row["accuracy"]["needle"] == pytest.approx((75.0, 25.0))
    table = study.format_markdown(results, [row])
    assert "| moba | 1 | 51 | 3.000 | 1.700 |" in table and "2.500 +- 0.500" in table


def test_arm_without_text_rows_is_an_error(tmp_path):
    arm = _fake_arm(tmp_path, "dense", 0, [2.0], 1.0, {"needle": [1]})
    path = os.path.join(arm.workdir, "eval.json")
    with open(path) as f:
        payload = json.load(f)
    payload["rows"] = [r for r in payload["rows"] if r["suite"] != "text"]
    with open(path, "w") as f:
        json.dump(payload, f)
    with pytest.raises(ValueError, match="held-out text"):
        study.arm_result(arm)


def test_commands_carry_seed_workdir_and_steps():
    settings = study.StudySettings(preset="cpu", steps=12, suite_lengths=(800,),
                                   suite_per_cell=2, text_per_cell=1, eval_batch_size=4)
    (arm,) = study.plan_arms(["moba"], [1], "/tmp/x")
    train, evaluate = study.arm_commands(arm, settings)
    assert f"--config={study.CONFIG}:moba,cpu" in train
    for flag in ("--config.train.seed=1", "--config.data.seed=1",
                 "--config.train.workdir=/tmp/x/moba-seed1", "--config.train.num_steps=12"):
        assert flag in train and flag in evaluate
    assert "--checkpoint=/tmp/x/moba-seed1" in evaluate and "--suite_lengths=800" in evaluate


def _report(path, arms, steps=700):
    path.write_text(json.dumps({"settings": {"steps": steps}, "arms": arms}))
    return str(path)


def test_reports_of_separate_calls_combine(tmp_path):
    arm = {"method": "moba", "seed": 0, "steps": 700, "train_loss": 1.0, "text_nll": 1.1,
           "answer_nll": 1.8, "accuracy": {"needle": 0.0}, "suite_accuracy": 0.0,
           "mean_budget": 4.0, "moved_share": 0.0}
    a = _report(tmp_path / "a.json", [arm])
    b = _report(tmp_path / "b.json", [dict(arm, seed=1, text_nll=1.3)])
    results, meta = study.combine_reports([a, b])
    assert [r["seed"] for r in results] == [0, 1] and meta["combined_from"] == [a, b]
    (row,) = study.summarize_arms(results)
    assert row["text_nll"] == pytest.approx((1.2, 0.1))
    with pytest.raises(ConfigError, match=r"--combine: arm \('moba', 0\) is in both"):
        study.combine_reports([a, a])
    c = _report(tmp_path / "c.json", [dict(arm, seed=2)], steps=500)
    with pytest.raises(ValueError, match="settings"):
        study.combine_reports([a, c])


def test_commands_carry_every_eval_setting():
    """The eval command's own flags, each from its setting, and every suite length; arms seed by
    seed (every method of seed 0 first): the table's rows of one seed sit together and a study
    cut short holds whole seeds."""
    settings = study.StudySettings(preset="gpu", steps=None, suite_lengths=(800, 1600),
                                   suite_per_cell=3, text_per_cell=5, eval_batch_size=7)
    arms = study.plan_arms(["dense", "moba"], [4, 9], "/tmp/x")
    assert [a.name for a in arms] == ["dense-seed4", "moba-seed4", "dense-seed9", "moba-seed9"]
    train, evaluate = study.arm_commands(arms[1], settings)
    assert not any(f.startswith("--config.train.num_steps") for f in train + evaluate)
    for flag in ("--output=/tmp/x/moba-seed4/eval.json", "--suite_per_cell=3",
                 "--text_per_cell=5", "--batch_size=7", "--suite_lengths=800,1600"):
        assert flag in evaluate, flag


def _harness_arm(tmp_path, losses_T, budgets_TS, examples, base):
    """An arm's files as the training loop and experiments.eval write them: every step's
    record (with the step's bucket beside the shards' budgets), and eval.json with rows per
    (suite, task, bucket) and per (suite, task) over all buckets."""
    arm = study.Arm("sparsebalance", 3, str(tmp_path / "sparsebalance-seed3"))
    os.makedirs(arm.workdir)
    with open(os.path.join(arm.workdir, "metrics.jsonl"), "w") as f:
        for step, (loss, budgets_S) in enumerate(zip(losses_T, budgets_TS), 1):
            rec = {"step": step, "loss": float(loss), "budget/bucket": 8.0}
            rec.update({f"budget/shard{s}": float(b) for s, b in enumerate(budgets_S)})
            f.write(json.dumps(rec) + "\n")
    settings = harness.EvalSettings(mode="teacher_forced", batch_size=2, seq_multiple=16,
                                    min_seq_len=16, budget=base, max_seq_len=256)
    harness.write_json(os.path.join(arm.workdir, "eval.json"), settings=settings,
                       rows=harness.summarize(examples), results=examples, meta={})
    return arm


def test_arm_numbers_from_files_the_loop_and_eval_write(tmp_path):
    """The last 50 steps' mean loss; the answer NLL and suite accuracy over the synthetic
    examples only (the held-out text's documents carry NLLs too), the accuracy weighing each
    example the same (tasks of 3 and 1 examples); budgets are the shards' (not the step's
    bucket) and a move is any budget off the base, down as well as up."""
    rng = np.random.default_rng()
    losses_T = rng.uniform(1.0, 4.0, 60)
    budgets_TS = rng.integers(3, 6, (60, 2))
    budgets_TS[0] = (3, 5)  # one move each way
    synthetic = [("needle", "800", 1.0), ("needle", "1600", 0.0), ("needle", "1600", 0.0),
                 ("vartrack", "800", 1.0)]
    nll_synthetic, nll_text = rng.uniform(0.5, 3.0, 4), rng.uniform(2.0, 6.0, 2)
    examples = [harness.ExampleResult("synthetic", t, b, s, float(n), None)
                for (t, b, s), n in zip(synthetic, nll_synthetic)]
    examples += [harness.ExampleResult("text", "heldout_wiki", b, 0.0, float(n), None)
                 for b, n in zip(("800", "1600"), nll_text)]
    result = study.arm_result(_harness_arm(tmp_path, losses_T, budgets_TS, examples, base=4))
    assert result["steps"] == 60
    assert result["train_loss"] == pytest.approx(sum(losses_T[10:]) / 50, rel=1e-12)
    assert result["text_nll"] == round((nll_text[0] + nll_text[1]) / 2, 4)
    assert result["answer_nll"] == pytest.approx(sum(nll_synthetic) / 4, rel=1e-12)
    assert result["accuracy"] == {"needle": 33.33, "vartrack": 100.0}
    assert result["suite_accuracy"] == 50.0  # 2 of 4 examples, not (33.33 + 100) / 2
    assert result["mean_budget"] == pytest.approx(budgets_TS.sum() / 120, rel=1e-12)
    assert result["moved_share"] == pytest.approx(np.count_nonzero(budgets_TS != 4) / 120,
                                                  rel=1e-12)


def test_summary_per_method_over_three_seeds():
    """Methods in first-seen order, each over its own arms only: mean and half the range
    (not the standard deviation, which two seeds cannot tell apart from it)."""
    rng = np.random.default_rng()
    keys = ("train_loss", "text_nll", "answer_nll", "suite_accuracy")
    results = []
    for method, seed in (("moba", 0), ("dense", 0), ("moba", 1), ("dense", 1), ("moba", 2)):
        row = {k: float(v) for k, v in zip(keys, rng.uniform(0.0, 5.0, 4))}
        results.append(dict(row, method=method, seed=seed,
                            accuracy={"needle": float(rng.uniform(0, 100))}))
    rows = study.summarize_arms(results)
    assert [(r["method"], r["seeds"]) for r in rows] == [("moba", [0, 1, 2]), ("dense", [0, 1])]
    for row in rows:
        arms = [r for r in results if r["method"] == row["method"]]
        for key in keys:
            vals = [r[key] for r in arms]
            assert row[key] == pytest.approx((sum(vals) / len(vals), (max(vals) - min(vals)) / 2),
                                             rel=1e-12), (row["method"], key)
        vals = [r["accuracy"]["needle"] for r in arms]
        assert row["accuracy"]["needle"] == pytest.approx(
            (sum(vals) / len(vals), (max(vals) - min(vals)) / 2), rel=1e-12)


_ARMS = [  # moba's two seeds around dense's one; dense's report predates the moved share
    {"method": "moba", "seed": 0, "steps": 700, "train_loss": 1.2, "text_nll": 2.5,
     "answer_nll": 1.75, "accuracy": {"needle": 50.0, "vartrack": 25.0}, "suite_accuracy": 37.5,
     "mean_budget": 4.25, "moved_share": 0.25},
    {"method": "dense", "seed": 0, "steps": 700, "train_loss": 1.0, "text_nll": 2.0,
     "answer_nll": 1.5, "accuracy": {"needle": 100.0, "vartrack": 50.0}, "suite_accuracy": 75.0,
     "mean_budget": 4.0},
    {"method": "moba", "seed": 1, "steps": 700, "train_loss": 1.4, "text_nll": 2.7,
     "answer_nll": 1.25, "accuracy": {"needle": 75.0, "vartrack": 0.0}, "suite_accuracy": 37.5,
     "mean_budget": 3.5, "moved_share": 0.5},
]
_SUMMARY = [
    {"method": "moba", "seeds": [0, 1], "train_loss": (1.3, 0.1), "text_nll": (2.6, 0.1),
     "answer_nll": (1.5, 0.25), "accuracy": {"needle": (62.5, 12.5), "vartrack": (12.5, 12.5)},
     "suite_accuracy": (37.5, 0.0)},
    {"method": "dense", "seeds": [0], "train_loss": (1.0, 0.0), "text_nll": (2.0, 0.0),
     "answer_nll": (1.5, 0.0), "accuracy": {"needle": (100.0, 0.0), "vartrack": (50.0, 0.0)},
     "suite_accuracy": (75.0, 0.0)},
]
_TABLE = """\
| method | seed | steps | train loss | held-out text NLL | answer NLL | needle | vartrack | suite acc. | mean budget | budgets moved |
|---|---|---|---|---|---|---|---|---|---|---|
| moba | 0 | 700 | 1.200 | 2.500 | 1.750 | 50.0 | 25.0 | 37.5 | 4.25 | 25% |
| dense | 0 | 700 | 1.000 | 2.000 | 1.500 | 100.0 | 50.0 | 75.0 | 4.00 | - |
| moba | 1 | 700 | 1.400 | 2.700 | 1.250 | 75.0 | 0.0 | 37.5 | 3.50 | 50% |
| **moba** (mean +- half-range) | 2 seeds | | 1.300 +- 0.100 | 2.600 +- 0.100 | 1.500 +- 0.250 | 62.5 +- 12.5 | 12.5 +- 12.5 | 37.5 +- 0.0 | | |
| **dense** (mean +- half-range) | 1 seeds | | 1.000 +- 0.000 | 2.000 +- 0.000 | 1.500 +- 0.000 | 100.0 +- 0.0 | 50.0 +- 0.0 | 75.0 +- 0.0 | | |
"""  # noqa: E501


def test_markdown_table_by_hand():
    """Every cell of the arms' and the methods' lines in its column; the moved share in
    percent, "-" where a report has none."""
    assert study.format_markdown(_ARMS, _SUMMARY) == _TABLE


def test_written_report_holds_arms_summary_and_table(tmp_path):
    meta = {"settings": {"steps": 700}}
    json_path, md_path = study.write_results(str(tmp_path), _ARMS, meta)
    assert (json_path, md_path) == (str(tmp_path / "study.json"), str(tmp_path / "study.md"))
    with open(json_path) as f:
        report = json.load(f)
    assert report["settings"] == meta["settings"] and report["arms"] == _ARMS
    assert [(r["method"], r["seeds"]) for r in report["summary"]] == [("moba", [0, 1]),
                                                                        ("dense", [0])]
    for row, expected in zip(report["summary"], _SUMMARY):
        for key in ("train_loss", "text_nll", "answer_nll", "suite_accuracy"):
            assert row[key] == pytest.approx(list(expected[key]), rel=1e-12)
    with open(md_path) as f:
        assert f.read() == _TABLE


def test_arms_run_logged_and_an_arm_killed_by_a_signal_fails_the_study(tmp_path, monkeypatch):
    """Each arm's train and eval commands, logged (the command line first) and run without
    GPU preallocation; an eval killed by a signal (a negative exit status, as from the OOM
    killer) fails the study with its log's last 30 lines."""
    report = "import os; print('preallocate', os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"
    killed = ("import os, signal\nfor i in range(40): print('line', i)\n"
              "os.kill(os.getpid(), signal.SIGKILL)")

    def commands(arm, settings):
        return ([sys.executable, "-c", report],
                [sys.executable, "-c", killed if arm.method == "killed" else "print('eval')"])

    monkeypatch.setattr(study, "arm_commands", commands)
    settings = study.StudySettings(preset="cpu", steps=1, suite_lengths=(), suite_per_cell=1,
                                   text_per_cell=1, eval_batch_size=1)
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    (arm,) = study.plan_arms(["dense"], [0], str(tmp_path))
    study.run_study([arm], settings, parallel=1, env=env)
    with open(os.path.join(arm.workdir, "train.log")) as f:
        assert f.read() == f"{sys.executable} -c {report}\n\npreallocate false\n"
    with open(os.path.join(arm.workdir, "eval.log")) as f:
        assert f.read().endswith("\n\neval\n")
    (arm,) = study.plan_arms(["killed"], [0], str(tmp_path))
    with pytest.raises(RuntimeError, match="eval.log of .*killed-seed0 exited with -9") as error:
        study.run_study([arm], settings, parallel=1, env=env)
    tail = str(error.value).split("its last lines:\n")[1]
    assert tail == "".join(f"line {i}\n" for i in range(10, 40))
