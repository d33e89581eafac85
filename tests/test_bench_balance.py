"""The straggler benchmark end to end on CPU: tiny sizes, MoBA in interpret mode.

Runs `experiments.bench_balance` as a subprocess (2 shards, 2 steps, both workloads, simulated
on one device; and one workload on a real mesh of 2 host devices) and checks that its JSON / PNG
/ markdown table exist and that the numbers agree with the benchmark's own definitions
(simulate.py's and mesh_runner.py's module docstrings).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sparsebalance_jax.balance import simulate, tuner
from tests.cpu_flags import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, BUCKETS, P = 4, (4, 6), 0.3  # P: configs/longbench.py balance.p


def _run(out, workloads, devices, *extra, repeats=1):
    cmd = [sys.executable, "-m", "experiments.bench_balance", "--interpret", "--shards=2",
           "--steps=2", "--seq_len=256", "--block_size=32", f"--budget={BASE}",
           "--buckets=" + ",".join(map(str, BUCKETS)), "--layers=1", f"--repeats={repeats}",
           "--min_doc_len=16", f"--out={out}", f"--workloads={workloads}", *extra]
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "bench_balance.json") as f:
        return out, json.load(f), done.stdout


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    # One host device: the benchmark simulates the shards.
    return _run(tmp_path_factory.mktemp("bench_balance"), "longalign,chatqa2", 1)


@pytest.fixture(scope="module")
def mesh_bench(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("bench_balance_mesh"), "chatqa2", 2,
                "--data_parallel=mesh", repeats=2)


def test_outputs_exist_and_the_table_is_printed_last(bench):
    out, results, stdout = bench
    assert (out / "bench_balance.png").stat().st_size > 10_000
    table = (out / "bench_balance.md").read_text()
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("| chatqa2 | +SAB+DST |")
    assert lines[-10].startswith("| workload | row |")
    for line in lines[-8:]:
        assert line in table
    assert set(results["workloads"]) == {"longalign", "chatqa2"}


def _check_rows(results, step_of):
    """The definitions every row follows; `step_of(record, measured_S)` is a step's seconds."""
    lo, hi = tuner.budget_bounds(BASE, P, BUCKETS[-1])
    for name, workload in results["workloads"].items():
        rows = workload["rows"]
        assert list(rows) == [m.name for m in simulate.METHODS]
        baseline_total = rows["baseline"]["summary"]["total_seconds"]
        for method in simulate.METHODS:
            row = rows[method.name]
            s = row["summary"]
            assert s["steps"] == len(row["steps"]) >= 2
            measured_TS = np.array([r["measured_S"] for r in row["steps"]])
            assert np.all(measured_TS > 0)
            step_T = np.array([step_of(r, np.array(r["measured_S"])) for r in row["steps"]])
            np.testing.assert_allclose([r["step_seconds"] for r in row["steps"]], step_T)
            assert s["total_seconds"] == pytest.approx(step_T.sum())
            ratio_T = measured_TS.max(1) / measured_TS.mean(1)
            assert np.all(ratio_T >= 1.0) and s["imbalance"] == pytest.approx(ratio_T.mean())
            assert s["speedup"] == pytest.approx(baseline_total / s["total_seconds"])
            assert s["compiles"] <= s["buckets"] == len(BUCKETS)
            budgets_TS = np.array([r["budgets_S"] for r in row["steps"]])
            if method.dst:
                assert np.all((budgets_TS >= lo) & (budgets_TS <= hi))
            else:
                assert np.all(budgets_TS == BASE) and s["tuner_ms"] == 0.0
            for r in row["steps"]:
                assert r["bucket"] == tuner.bucket_for(np.array(r["budgets_S"]), BUCKETS)
                assert all(0.0 <= c <= 1.0 for c in r["coverage_S"])
            doc_ids = sorted(i for r in row["steps"] for i in r["doc_ids"])
            assert doc_ids == list(range(workload["documents"])), (name, method.name)
            assert s["every_document_once"]
        assert rows["baseline"]["summary"]["speedup"] == 1.0


def test_numbers_follow_the_definitions(bench):
    _, results, _ = bench
    allreduce = results["settings"]["allreduce_seconds"]
    assert allreduce == pytest.approx(simulate.allreduce_seconds(
        results["settings"]["param_bytes"], 2, 400e9))

    def step_of(record, measured_S):
        np.testing.assert_allclose(measured_S, np.array(record["measured_SM"]).sum(-1))
        assert np.all(np.array(record["measured_SM"]) > 0)
        return measured_S.max() + allreduce

    _check_rows(results, step_of)


def test_mesh_rows_time_each_shard_on_its_own_device(mesh_bench):
    out, results, stdout = mesh_bench
    settings = results["settings"]
    assert settings["data_parallel"] == "mesh" and settings["devices"] == ["cpu:0", "cpu:1"]
    assert stdout.strip().splitlines()[-1].startswith("| chatqa2 | +SAB+DST |")
    assert "real all-reduce" in (out / "bench_balance.md").read_text()
    allreduce = settings["allreduce_seconds"]

    def step_of(record, measured_S):
        # Shards: per-shard median of the timed calls; the step: median of the fused step's.
        runs_RS = np.array(record["shard_runs_RS"])
        assert runs_RS.shape == (2, 2) and np.all(runs_RS > 0)
        np.testing.assert_allclose(measured_S, np.median(runs_RS, axis=0))
        assert record["modeled_step_seconds"] == pytest.approx(measured_S.max() + allreduce)
        assert len(record["step_runs"]) == 2 and min(record["step_runs"]) > 0
        # Every call starts from the initial state: the same batch gives the same loss.
        assert len(set(record["step_losses"])) == 1, record["step_losses"]
        return np.median(record["step_runs"])

    _check_rows(results, step_of)
