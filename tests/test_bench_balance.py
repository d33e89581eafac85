"""The one-device straggler benchmark end to end on CPU: tiny sizes, MoBA in interpret mode.

Runs `experiments.bench_balance` as a subprocess (2 shards, 2 steps, both workloads) and checks
that its JSON / PNG / markdown table exist and that the numbers agree with the benchmark's own
definitions (simulate.py's module docstring).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sparsebalance_jax.balance import simulate, tuner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, BUCKETS, P = 4, (4, 6), 0.3  # P: configs/longbench.py balance.p


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_balance")
    cmd = [sys.executable, "-m", "experiments.bench_balance", "--interpret", "--shards=2",
           "--steps=2", "--seq_len=256", "--block_size=32", f"--budget={BASE}",
           "--buckets=" + ",".join(map(str, BUCKETS)), "--layers=1", "--repeats=1",
           "--min_doc_len=16", f"--out={out}", "--workloads=longalign,chatqa2"]
    env = dict(os.environ, XLA_FLAGS="")  # One host device: the benchmark simulates the shards.
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "bench_balance.json") as f:
        return out, json.load(f), done.stdout


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


def test_numbers_follow_the_definitions(bench):
    _, results, _ = bench
    allreduce = results["settings"]["allreduce_seconds"]
    assert allreduce == pytest.approx(simulate.allreduce_seconds(
        results["settings"]["param_bytes"], 2, 400e9))
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
            measured_TSM = np.array([r["measured_SM"] for r in row["steps"]])
            np.testing.assert_allclose(measured_TS, measured_TSM.sum(-1))
            assert np.all(measured_TSM > 0)
            step_T = measured_TS.max(1) + allreduce
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
