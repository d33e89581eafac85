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
import types

import grain
import numpy as np
import pytest

from sparsebalance_jax.balance import mesh_runner, report, simulate, tuner
from sparsebalance_jax.balance.latency import AnalyticLatencyModel, LayerShape
from sparsebalance_jax.data import batching
from tests.cpu_flags import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, BUCKETS, P = 4, (4, 6), 0.3  # P: configs/longbench.py balance.p
# Documents of this seed leave the shards' first-step predictions (the EMA has measured
# nothing yet) more than the 2% dead band apart in three of the four DST rows, among them
# chatqa2 +SAB+DST: its straggler drops to budget 3 and its light shard rises to 5, which with
# --noraise_within_bucket (the simulated run) runs that step in bucket 6, compiled for it.
SEED = 32


def _run(out, workloads, devices, *extra, repeats=1):
    cmd = [sys.executable, "-m", "experiments.bench_balance", "--interpret", "--shards=2",
           "--steps=2", "--seq_len=256", "--block_size=32", f"--budget={BASE}",
           "--buckets=" + ",".join(map(str, BUCKETS)), "--layers=1", f"--repeats={repeats}",
           "--min_doc_len=16", f"--seed={SEED}", f"--out={out}", f"--workloads={workloads}",
           *extra]
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "bench_balance.json") as f:
        return out, json.load(f), done.stdout


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    # One host device: the benchmark simulates the shards.
    return _run(tmp_path_factory.mktemp("bench_balance"), "longalign,chatqa2", 1,
                "--noraise_within_bucket")


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
    assert lines[-10].startswith("| workload | row |") and "| probe ms |" in lines[-10]
    for line in lines[-8:]:
        assert line in table
    assert set(results["workloads"]) == {"longalign", "chatqa2"}


def _check_rows(results, step_of):
    """The definitions every row follows; `step_of(record, measured_S)` is the runner's
    seconds for a step (the step a DST row pays adds its decision)."""
    lo, hi = tuner.budget_bounds(BASE, P, BUCKETS[-1])
    moved = set()
    for name, workload in results["workloads"].items():
        rows = workload["rows"]
        assert list(rows) == [m.name for m in simulate.METHODS]
        totals = {}
        for method in simulate.METHODS:
            row = rows[method.name]
            s = row["summary"]
            assert s["steps"] == len(row["steps"]) >= 2
            measured_TS = np.array([r["measured_S"] for r in row["steps"]])
            assert np.all(measured_TS > 0)
            runner_T = np.array([step_of(r, np.array(r["measured_S"])) for r in row["steps"]])
            np.testing.assert_allclose([r["runner_step_seconds"] for r in row["steps"]],
                                       runner_T)
            tuner_T = np.array([r["tuner_seconds"] for r in row["steps"]])
            probe_T = np.array([r["coverage_seconds"] for r in row["steps"]])
            step_T = runner_T + tuner_T  # the decision is paid before the step, as in training
            np.testing.assert_allclose([r["step_seconds"] for r in row["steps"]], step_T)
            totals[method.name] = step_T.sum()
            assert s["total_seconds"] == pytest.approx(step_T.sum())
            assert s["tuner_ms"] == pytest.approx(1e3 * tuner_T.mean())
            assert s["tuner_pct"] == pytest.approx(100 * tuner_T.sum() / step_T.sum())
            assert s["coverage_ms"] == pytest.approx(1e3 * probe_T.mean())
            ratio_T = measured_TS.max(1) / measured_TS.mean(1)
            assert s["imbalance"] == pytest.approx(ratio_T.mean())
            budgets_TS = np.array([r["budgets_S"] for r in row["steps"]])
            buckets_T = [r["bucket"] for r in row["steps"]]
            assert s["compiles"] == len(set(buckets_T)) <= s["buckets"] == len(BUCKETS)
            for r in row["steps"]:
                assert r["bucket"] == tuner.bucket_for(np.array(r["budgets_S"]), BUCKETS)
                assert all(0.0 <= c <= 1.0 for c in r["coverage_S"])
                # The loop prefetches the probe behind every step: every DST step pays it.
                assert (r["coverage_seconds"] > 0) == method.dst
            if method.dst:
                assert np.all((budgets_TS >= lo) & (budgets_TS <= hi))
                if np.any(budgets_TS[0] != BASE):
                    moved.add((name, method.name, tuple(budgets_TS[0]), buckets_T[0]))
            else:
                assert np.all(budgets_TS == BASE) and buckets_T == [BASE] * len(buckets_T)
                assert np.all(tuner_T == 0) and np.all(probe_T == 0)
            doc_ids = sorted(i for r in row["steps"] for i in r["doc_ids"])
            assert doc_ids == list(range(workload["documents"])), (name, method.name)
            assert s["every_document_once"]
        for method, total in totals.items():
            assert rows[method]["summary"]["speedup"] == pytest.approx(
                totals["baseline"] / total)
    return moved


def test_numbers_follow_the_definitions(bench):
    _, results, _ = bench
    allreduce = results["settings"]["allreduce_seconds"]
    assert allreduce == pytest.approx(simulate.allreduce_seconds(
        results["settings"]["param_bytes"], 2, 400e9))

    def step_of(record, measured_S):
        np.testing.assert_allclose(measured_S, np.array(record["measured_SM"]).sum(-1))
        assert np.all(np.array(record["measured_SM"]) > 0)
        return measured_S.max() + allreduce

    moved = _check_rows(results, step_of)
    # DST moved budgets in its first step, and a raise compiled and ran the second bucket.
    assert ("chatqa2", "+SAB+DST", (3, 5), 6) in moved, moved
    assert results["workloads"]["chatqa2"]["rows"]["+SAB+DST"]["summary"]["compiles"] == 2
    assert results["settings"]["compiles_total"] == 2


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

    moved = _check_rows(results, step_of)
    # Raises stay in the base's bucket (the default): the straggler alone moves.
    assert ("chatqa2", "+SAB+DST", (3, 4), 4) in moved, moved


def test_a_simulated_step_pays_the_slowest_shards_probe():
    """DeviceRunner.decision_coverage times each shard's probe on its rows alone and charges
    the slowest - each device of a data-parallel run probes its own shard at once - with the
    curve of every shard in order."""
    timed = []

    class Probe:
        def __call__(self, step_batch, params):
            return np.asarray(step_batch["inputs"][:, 0, 0, :BASE] / 10, np.float32)

        def device_seconds(self, step_batch, params, *, repeats):
            s = int(step_batch["inputs"][0, 0, 0, 0])
            timed.append((step_batch["inputs"].shape[0], repeats))
            return [0.002, 0.005, 0.003][s]

    runner = object.__new__(simulate.DeviceRunner)
    runner.params, runner._coverage = None, {"decision": Probe()}
    batch = {k: np.arange(3).reshape(3, 1, 1, 1) * np.ones((3, 1, 2, 8), np.int32)
             for k in ("inputs", "segment_ids", "positions")}
    curve, seconds = runner.decision_coverage(batch, repeats=4)
    assert timed == [(1, 4)] * 3  # one shard's rows per timing
    np.testing.assert_allclose(curve, np.repeat([[0.0], [0.1], [0.2]], BASE, axis=1), rtol=1e-6)
    assert seconds == 0.005


def _old_record(step_seconds, tuner_seconds, coverage_seconds, budgets_S):
    """A step as results written before the step counted the decision's probe hold it."""
    return dict(step_seconds=step_seconds, tuner_seconds=tuner_seconds,
                coverage_seconds=coverage_seconds, budgets_S=budgets_S, measured_S=[0.09, 0.08],
                predicted_before_S=[0.09, 0.08], predicted_after_S=[0.09, 0.08],
                tokens_S=[100, 100], coverage_S=[0.9, 0.9], doc_ids=[])


def test_recount_adds_the_decisions_probe_to_its_step_and_overhead():
    # Base 16, p 0.3: the floor check of a lowered shard probes budget 11, once; the other
    # probe calls of a step (the chosen budgets' coverage) were made for the report only.
    fixed = [_old_record(0.100, 0.0, 0.005, [16, 16]), _old_record(0.100, 0.0, 0.005, [16, 16])]
    tuned = [_old_record(0.095, 0.001, 0.010, [11, 16]),  # calls at 11, 16: the decision's 1
             _old_record(0.090, 0.002, 0.015, [13, 14]),  # calls at 11, 13, 14
             _old_record(0.094, 0.001, 0.010, [16, 18])]  # nothing lowered: no probe
    rows = {name: {"steps": list(fixed if name in ("baseline", "+SAB") else tuned),
                   "summary": {"compiles": 1, "every_document_once": True}}
            for name in ("baseline", "+DST", "+SAB", "+SAB+DST")}
    rows["baseline"]["steps"] = fixed + [_old_record(0.100, 0.0, 0.005, [16, 16])]
    rows["+SAB"]["steps"] = [_old_record(0.098, 0.0, 0.006, [16, 16])] * 3
    data = {"settings": {"base_budget": 16, "p": 0.3, "buckets": [16, 24]},
            "workloads": {"w": {"documents": 0, "rows": rows}}}
    out = simulate.recount_decision(data)["workloads"]["w"]["rows"]
    steps = out["+DST"]["steps"]
    np.testing.assert_allclose([r["coverage_seconds"] for r in steps], [0.005, 0.005, 0.0])
    np.testing.assert_allclose([r["tuner_seconds"] for r in steps], [0.006, 0.007, 0.001])
    np.testing.assert_allclose([r["step_seconds"] for r in steps], [0.101, 0.097, 0.095])
    assert [r["runner_step_seconds"] for r in steps] == [0.095, 0.090, 0.094]
    assert [r["coverage_calls"] for r in steps] == [1, 1, 0]
    s = out["+DST"]["summary"]
    assert s["tuner_ms"] == pytest.approx(14 / 3) and s["coverage_ms"] == pytest.approx(10 / 3)
    assert s["tuner_pct"] == pytest.approx(100 * 0.014 / 0.293)
    assert s["speedup"] == pytest.approx(0.300 / 0.293)
    # Rows without DST make no decision: their report-only probes are not counted.
    assert out["+SAB"]["summary"]["speedup"] == pytest.approx(0.300 / 0.294)
    assert out["baseline"]["summary"]["tuner_ms"] == 0 == out["baseline"]["summary"]["coverage_ms"]
    with pytest.raises(ValueError, match="already count"):
        simulate.recount_decision({"settings": data["settings"], "workloads": {"w": {
            "rows": {"+DST": {"steps": steps}}}}})


def test_recount_command_prints_the_dst_rows_of_a_stored_run():
    path = os.path.join(REPO, "benchmarks", "h200", "balance_dp", "simulated",
                        "bench_balance.json")
    done = subprocess.run([sys.executable, "-m", "experiments.bench_balance",
                           f"--recount={path}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "| workload | row | step ms | speedup | tuner ms (%) | probe ms |"
    with open(path) as f:
        stored = json.load(f)["workloads"]
    rows = [(w, m) for w in stored for m in stored[w]["rows"] if "DST" in m]
    assert [tuple(line.split(" | ")[:2]) for line in lines[2:]] == [
        (f"| {w}", m) for w, m in rows]
    for line, (w, m) in zip(lines[2:], rows):
        # The baseline is unchanged and a DST row's steps only grow: its speedup can only fall.
        assert float(line.split(" | ")[3]) <= round(stored[w]["rows"][m]["summary"]["speedup"], 3)


def test_allreduce_is_a_ring_all_reduce_of_the_gradients():
    # 2 (N - 1) / N x bytes / bandwidth: 4 ranks, 8 GB at 400 GB/s -> 1.5 x 20 ms.
    assert simulate.allreduce_seconds(8e9, 4, 400e9) == pytest.approx(0.03, rel=1e-12)
    assert simulate.allreduce_seconds(8e9, 2, 400e9) == pytest.approx(0.02, rel=1e-12)
    assert simulate.allreduce_seconds(8e9, 1, 400e9) == 0.0


def _dst_run_inputs(steps, num_docs):
    """A small +DST run's cost model, setup and batches: four shards of one 1024-token row,
    random batching of num_docs lognormal documents, base budget 8 in buckets (8, 12)."""
    model = AnalyticLatencyModel(LayerShape(64, 4, 2, 16, 128, 16), attention_flops_per_s=2e11)
    config = tuner.TunerConfig(anchor="mean", p=0.3, coverage_floor=0.0, buckets=(8, 12),
                               raise_within_bucket=False)
    setup = simulate.BenchSetup(num_shards=4, micro_batches=1, rows_per_micro_batch=1,
                                row_len=1024, steps=steps, base_budget=8, tuner=config,
                                ema_decay=0.5, repeats=1, bus_bytes_per_s=1e9, seed=0)
    rng = np.random.default_rng()
    lengths = np.clip(rng.lognormal(np.log(300), 0.9, size=num_docs), 16, 1024).astype(int)
    docs = [{"inputs": np.ones(n, np.int32), "targets": np.ones(n, np.int32),
             "loss_mask": np.ones(n, np.float32)} for n in lengths]
    batches = list(batching.make_batcher(
        "random", grain.MapDataset.source(docs).to_iter_dataset(), num_shards=4,
        micro_batches=1, rows_per_micro_batch=1, row_len=1024, align=16, base_budget=8,
        window=100, cost_model=model, seed=int(rng.integers(1000))))
    return model, setup, batches


class _ModelDevice:
    """A runner for _dst_run_inputs' four shards whose device takes `scale` times the latency
    model's prediction at the budget each shard ran, and whose coverage report (read at every
    budget 1..12) is `report_SK`."""

    def __init__(self, model, scale, report_SK):
        self.model, self.scale, self.report_SK = model, scale, report_SK

    def decision_coverage(self, batch, repeats):
        return np.ones((4, 8)), 0.0

    def shard_coverage(self, batch, use):
        assert use == "report"
        return self.report_SK

    def measure_step(self, batch, budgets_S, bucket, setup, used):
        seconds_S = self.scale * np.array([
            self.model.predict(batch["doc_lengths"][s, 0], int(budgets_S[s]), padded_tokens=1024)
            for s in range(4)])
        return dict(measured_SM=seconds_S[:, None].tolist(), measured_S=seconds_S.tolist(),
                    step_seconds=seconds_S.max())


def test_the_ema_learns_from_the_prediction_at_the_budgets_that_ran():
    """run_method feeds the tuner each shard's measured time against the uncorrected
    prediction at the budget the shard ran, not at the base: with a device exactly 3x the
    latency model at every budget, the corrected predictions are exact from the second step
    on, budgets moved or not."""
    model, setup, batches = _dst_run_inputs(steps=4, num_docs=60)
    runner = _ModelDevice(model, scale=3.0, report_SK=np.ones((4, 12)))
    out = simulate.run_method(simulate.Method("+DST", "random", True), batches, setup, runner,
                              model, log=lambda _: None)
    steps = out["steps"]
    assert any(b != 8 for r in steps[:-1] for b in r["budgets_S"])  # the tuner moved budgets
    for r in steps[1:]:
        np.testing.assert_allclose(r["predicted_after_S"], r["measured_S"], rtol=1e-9)
    assert out["summary"]["prediction_error"] == pytest.approx(0.0, abs=1e-9)


def test_summary_numbers_by_hand():
    """_summarize on two hand-made steps of three shards. Imbalance: max / mean per step
    (3 / 2 and 8 / 4), mean over steps; predicted ones alike. Prediction error from step 2
    on, relative to the measured time: |2.5 - 2| / 2, |1.5 - 2| / 2, 0 -> 1/6. Coverage
    weighted by each shard's tokens; tuner share of the summed step time."""
    def record(measured, before, after, tokens, coverage, budgets, step, tuner, probe, ids):
        return dict(measured_S=measured, predicted_before_S=before, predicted_after_S=after,
                    tokens_S=tokens, coverage_S=coverage, budgets_S=budgets, step_seconds=step,
                    tuner_seconds=tuner, coverage_seconds=probe, doc_ids=ids)
    records = [record([1.0, 2.0, 3.0], [2.0, 2.0, 2.0], [9.0, 9.0, 1.0], [100, 100, 200],
                      [0.5, 1.0, 0.8], [4, 4, 3], 3.5, 0.1, 0.05, [0, 1]),
               record([2.0, 2.0, 8.0], [1.0, 1.0, 4.0], [2.5, 1.5, 8.0], [300, 100, 100],
                      [0.9, 0.6, 0.3], [5, 4, 4], 8.5, 0.3, 0.1, [2, 3, 4])]
    s = simulate._summarize(records, compiles=2, buckets=3)
    assert s["steps"] == 2 and s["compiles"] == 2 and s["buckets"] == 3
    assert s["imbalance"] == pytest.approx((1.5 + 2.0) / 2, rel=1e-12)
    assert s["predicted_imbalance_before"] == pytest.approx((1.0 + 2.0) / 2, rel=1e-12)
    assert s["predicted_imbalance_after"] == pytest.approx((9 / (19 / 3) + 8 / 4) / 2, rel=1e-12)
    assert s["prediction_error"] == pytest.approx(1 / 6, rel=1e-12)
    assert s["mean_step_seconds"] == pytest.approx(6.0) and s["total_seconds"] == pytest.approx(12)
    assert s["mean_max_shard_seconds"] == pytest.approx(5.5, rel=1e-12)
    assert s["tuner_ms"] == pytest.approx(200.0) and s["coverage_ms"] == pytest.approx(75.0)
    assert s["tuner_pct"] == pytest.approx(100 * 0.4 / 12, rel=1e-12)
    assert s["mean_budget"] == pytest.approx(4.0)
    assert s["mean_coverage"] == pytest.approx(670 / 900, rel=1e-12)
    assert s["min_shard_coverage"] == 0.3
    assert s["documents"] == 5 == s["distinct_documents"]


def test_a_step_reports_the_coverage_at_the_budget_each_shard_ran():
    """run_method reads the report's coverage column k - 1 for a shard at budget k (a probe
    whose column j reads (j + 1) / 100 gives budget / 100)."""
    model, setup, batches = _dst_run_inputs(steps=3, num_docs=40)
    runner = _ModelDevice(model, scale=1.0, report_SK=np.tile(np.arange(1, 13) / 100, (4, 1)))
    out = simulate.run_method(simulate.Method("+DST", "random", True), batches, setup, runner,
                              model, log=lambda _: None)
    assert any(b != 8 for r in out["steps"] for b in r["budgets_S"])  # budgets moved
    for r in out["steps"]:
        np.testing.assert_allclose(r["coverage_S"], np.array(r["budgets_S"]) / 100, rtol=1e-12)


def test_mesh_step_takes_each_shards_median_and_the_fused_steps(monkeypatch):
    """MeshRunner.measure_step with its programs replaced (nothing runs): after one warm-up
    call, three timed calls of the shard program give shard times 1, 5 / 2, 1 / 9, 3 (median
    2 and 3) and of the fused step 0.3, 0.1, 0.8 s (median 0.3) on the host's clock; the
    modeled step is the slowest shard plus the ring all-reduce."""
    now = [0.0]
    shard_runs = iter([[7.0, 7.0], [1.0, 5.0], [2.0, 1.0], [9.0, 3.0]])
    fused_runs = iter([10.0, 0.3, 0.1, 0.8])

    def fused(bucket, state, batch):
        now[0] += next(fused_runs)
        return None, {"loss": 1.0}, None

    fused.batch_shardings, fused.layout = None, lambda batch: batch
    runner = object.__new__(mesh_runner.MeshRunner)
    runner.mesh = types.SimpleNamespace(shape={"data": 2})
    runner.param_bytes, runner.params, runner.initial_state = 8e9, None, {"w": np.zeros(2)}
    runner._timed = types.SimpleNamespace(
        batch_shardings=None, layout=lambda batch: batch,
        time_shards=lambda bucket, params, batch: np.array(next(shard_runs)))
    runner._fused = fused
    monkeypatch.setattr(mesh_runner, "global_batch", lambda shardings, batch: batch)
    monkeypatch.setattr(mesh_runner, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    setup = types.SimpleNamespace(num_shards=2, repeats=3, bus_bytes_per_s=400e9)
    batch = {"budgets": np.zeros((2, 1, 1), np.int32), "inputs": np.zeros((2, 1, 1, 4))}
    got = runner.measure_step(batch, np.array([4, 4]), 4, setup, set())
    np.testing.assert_allclose(got["measured_S"], [2.0, 3.0])
    np.testing.assert_allclose(got["step_runs"], [0.3, 0.1, 0.8])
    assert got["step_seconds"] == pytest.approx(0.3)
    assert got["modeled_step_seconds"] == pytest.approx(3.0 + 0.02)


def test_markdown_table_cells_follow_the_summary():
    """balance.report's table from a hand-made summary: times in ms (the mean step, not the
    total), ratios as given, one line per (workload, row)."""
    s = dict(steps=3, imbalance=1.23456, mean_step_seconds=0.0825, total_seconds=0.2475,
             speedup=1.1, tuner_ms=0.5, tuner_pct=0.61, coverage_ms=0.25, compiles=2,
             buckets=3, mean_budget=4.5, mean_coverage=0.9, prediction_error=0.0123)
    results = {"w": {"rows": {"baseline": {"summary": s}, "+DST": {"summary": dict(s, speedup=2)}}}}
    lines = report.markdown_table(results).splitlines()
    assert lines[0] == "| " + " | ".join(report.TABLE_COLUMNS) + " |"
    assert lines[1] == "|---" * 12 + "|" and len(lines) == 4  # a rule under each of 12 columns
    assert lines[2] == ("| w | baseline | 3 | 1.235 | 82.5 | 1.100 | 0.50 (0.61%) | 0.25 | 2 / 3 "
                        "| 4.50 | 0.900 | 0.012 |")
    assert report.decision_table(results, ["+DST"]).splitlines()[1:] == [
        "|---" * 6 + "|", "| w | +DST | 82.5 | 2.000 | 0.50 (0.61%) | 0.25 |"]


def test_png_shows_each_rows_times_budgets_and_imbalances(tmp_path, monkeypatch):
    """balance.report's figure from hand-made rows (2 workloads x 2 rows, 3 steps of 2 shards):
    per row, the shards' times in ms over steps 1..3 with the step's max, and their budgets;
    below, per (workload, row), the bars predicted before, predicted after and measured, side
    by side in that order, on an axis from just under 1. The PNG is the figure at 90 dpi."""
    import matplotlib.pyplot as plt

    rng = np.random.default_rng()
    keys = ("predicted_imbalance_before", "predicted_imbalance_after", "imbalance")
    results = {}
    for name in ("longalign", "chatqa2"):
        rows = {}
        for method in ("baseline", "+DST"):
            steps = [{"measured_S": rng.uniform(0.01, 0.1, 2).tolist(),
                      "budgets_S": rng.integers(2, 7, 2).tolist()} for _ in range(3)]
            summary = dict(zip(keys, rng.uniform(1.0, 1.5, 3).tolist()))
            rows[method] = {"steps": steps, "summary": summary}
        results[name] = {"rows": rows}
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    path = str(tmp_path / "bench.png")
    report.write_png(path, results, "the title")
    (fig,) = figures
    try:
        assert fig.get_suptitle() == "the title"
        axes = iter(fig.axes)
        for w, (name, workload) in enumerate(results.items()):
            for c, (method, row) in enumerate(workload["rows"].items()):
                measured_TS = 1e3 * np.array([r["measured_S"] for r in row["steps"]])
                budgets_TS = np.array([r["budgets_S"] for r in row["steps"]])
                times, budgets = next(axes), next(axes)
                # The grid: times above budgets, a column per row; 5 x 2 cells in all.
                for ax, grid_row in ((times, 2 * w), (budgets, 2 * w + 1)):
                    spec = ax.get_subplotspec()
                    assert (spec.rowspan, spec.colspan) == (range(grid_row, grid_row + 1),
                                                            range(c, c + 1))
                    assert spec.get_gridspec().get_geometry() == (5, 2)
                assert times.get_title() == f"{name} / {method}"
                *shards, top = times.get_lines()
                for line, want_T in zip(shards + [top], [*measured_TS.T, measured_TS.max(1)]):
                    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
                    np.testing.assert_array_equal(line.get_ydata(), want_T)
                assert len(shards) == 2 and top.get_label() == "max (step)"
                lines = budgets.get_lines()
                assert len(lines) == 2
                for line, want_T in zip(lines, budgets_TS.T):
                    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
                    np.testing.assert_array_equal(line.get_ydata(), want_T)
        bars = next(axes)
        assert next(axes, None) is None
        assert (bars.get_subplotspec().rowspan, bars.get_subplotspec().colspan) == (
            range(4, 5), range(0, 2))
        cells = [(n, m) for n in results for m in results[n]["rows"]]
        assert [t.get_text() for t in bars.get_xticklabels()] == [f"{n}\n{m}" for n, m in cells]
        assert [t.get_text() for t in bars.get_legend().get_texts()] == [
            "predicted, base budget", "predicted, chosen budgets", "measured"]
        for i, (key, container) in enumerate(zip(keys, bars.containers)):
            assert [p.get_height() for p in container] == [
                results[n]["rows"][m]["summary"][key] for n, m in cells]
            centres = [p.get_x() + p.get_width() / 2 for p in container]
            np.testing.assert_allclose(centres, np.arange(4) + (i - 1) * 0.27, atol=1e-12)
        assert bars.get_ylim()[0] == pytest.approx(0.98, abs=1e-12)
    finally:
        close(fig)
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, height) == (round(4.2 * 2 * 90), round(3.0 * 5 * 90))


def test_dense_attention_runs_only_the_rows_without_dst(tmp_path):
    """Dense attention ignores the budgets: the DST rows would report budgets and coverage
    nothing ran at, so only the baseline and +SAB run."""
    _, data, stdout = _run(tmp_path, "chatqa2", 1, "--attention=reference")
    assert list(data["workloads"]["chatqa2"]["rows"]) == ["baseline", "+SAB"]
    assert "the DST rows are left out" in stdout
    assert data["settings"]["probe_stride"] >= 1
