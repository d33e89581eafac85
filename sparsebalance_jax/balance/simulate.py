"""Simulated data parallelism on one device: the straggler benchmark's measurement logic.

Owns how the one-device benchmark (`experiments/bench_balance.py`) turns documents into
measured synchronous steps, for the four ablation rows (`METHODS`): MoBA at a fixed budget with
length-based batching (the baseline), + DST (tuned per-shard budgets), + SAB (sparsity-aware
batching), + SAB + DST.

What is measured (DESIGN.md, "Definitions used in every measurement"):

- Documents: the pipeline's documents (`data.pipeline.document_dataset`) in index order, as
  many as fill `steps` global batches under the batcher's window rule; every row plans the same
  documents as one window of `steps` global batches (`data.batching`), so rows differ only in
  who goes where and at which budget.
- A shard's time is measured, not modeled: every (shard, micro-batch) of a step runs the
  model's forward+backward (`training.step.loss_and_grads` on that one micro-batch, gradients
  included, no optimizer update: parameters stay at their initial values) one after another on
  the one device; each micro-batch's time is `timing.time_call`: one warm-up call, then the
  median of `repeats` blocking calls. A shard's time is the sum over its micro-batches.
- A synchronous step costs max over shards + a modeled ring all-reduce of the float32
  gradients, 2 (N - 1) / N * parameter bytes / bus bandwidth, identical for every row; a DST
  row's step also pays its decision, as the train loop does (below). Per step the record keeps
  the runner's step (`runner_step_seconds`) and the sum (`step_seconds`).
- Imbalance: max / mean of the shards' measured times, per step, mean over steps. Speedup: the
  baseline's summed step time over the row's.
- Budgets are per shard (all rows of a shard share one). The tuner sees a shard as one unit:
  its micro-batches' predictions summed (`tuner.shard_latency_table`, one layer's latency model,
  padding included), corrected online per shard by `EmaCorrection` with the shard's measured
  time at the budgets it ran. The latency model prices one layer and the measurement is the
  whole model; the EMA ratio absorbs the scale (layers, embedding, LM head), and since every
  layer sees the same documents at the same budget, per-shard imbalance is a per-layer quantity.
- Tuner overhead (`tuner_seconds`): the decision as the train loop pays it before every step
  (`training.budgets.DstBalancer`): the shard x budget latency table and the rule, timed on the
  host, plus the coverage probe (`training.launch.CoverageProbe`, the loop's own probe: every
  shard's coverage at every budget, for the rule's floor check). The loop dispatches that probe
  for the next step while the current one runs (`DstBalancer.prefetch`), on the step's mesh,
  each device probing its own shard: its host work overlaps the running step and the step
  pays the device's time on it. So every DST step is charged that: each shard's probe timed
  alone on the device (its own clock on a GPU; the synchronised wall time elsewhere and on a
  mesh), the slowest shard's (`DeviceRunner.decision_coverage`). The probe's part is also
  kept on its own (`coverage_seconds`, `coverage_calls` = 1 per DST step). Runs recorded
  earlier charged the probe's whole synchronised call, host part included, only on steps that
  weighed a cut (one call per budget before the probe gave every budget at once; one call for
  every shard on the one device before 2026-12-04's per-shard charge). Rows without DST make no
  decision (the loop's `FixedBudgets`): 0.
- Coverage: `pallas_kernels.moba.moba_coverage_curve` on the first layer's q / k of the
  current (initial) parameters, per row, averaged over a shard's rows weighted by their
  non-padding tokens. Reported at the chosen budgets (`coverage_S`) from a probe up to the
  largest bucket, made for the report only and not timed (the train loop does not make it).
- The same rows on real devices, one shard per device: `balance.mesh_runner.MeshRunner` in
  place of `DeviceRunner` (`bench_balance.py --data_parallel=mesh`).
- Compiles: one `CompileCache` (one compiled step per budget bucket and shape) is shared by
  every row and workload; a row's `compiles` is the number of distinct compiled steps it ran,
  each of which was a real compile (counted by the cache) when first needed.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import grain
import jax
import numpy as np

from sparsebalance_jax.balance.compile_cache import CompileCache
from sparsebalance_jax.balance.latency import LatencyModel
from sparsebalance_jax.balance.timing import time_call
from sparsebalance_jax.balance.tuner import (Tuner, TunerConfig, budget_bounds,
                                             shard_latency_table)
from sparsebalance_jax.config import AttentionConfig, Config, ModelConfig
from sparsebalance_jax.data import batching
from sparsebalance_jax.data.packing import aligned_length
from sparsebalance_jax.data.pipeline import DataSpec, document_dataset
from sparsebalance_jax.model import Transformer
from sparsebalance_jax.training.launch import CoverageProbe
from sparsebalance_jax.training.state import dummy_inputs
from sparsebalance_jax.training.step import BATCH_KEYS, loss_and_grads


@dataclasses.dataclass(frozen=True)
class Method:
    """One ablation row: which batcher, and whether DST tunes the budgets."""

    name: str
    batcher: str
    dst: bool


METHODS = (Method("baseline", "lbb", False), Method("+DST", "lbb", True),
           Method("+SAB", "sab", False), Method("+SAB+DST", "sab", True))


@dataclasses.dataclass(frozen=True)
class BenchSetup:
    """Geometry, budgets and measurement settings shared by every row and workload."""

    num_shards: int
    micro_batches: int
    rows_per_micro_batch: int
    row_len: int
    steps: int  # Global batches of documents (the rows plan them as one window).
    base_budget: int
    tuner: TunerConfig  # `enabled` is set per row; buckets are the compiled k_max values.
    ema_decay: float
    repeats: int  # Timed calls per micro-batch (median), after one warm-up call.
    bus_bytes_per_s: float  # All-reduce bus bandwidth of the modeled collective.
    seed: int
    fill: float = batching.DEFAULT_FILL

    def __post_init__(self):
        for name in ("num_shards", "micro_batches", "rows_per_micro_batch", "row_len", "steps",
                     "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"BenchSetup.{name}={getattr(self, name)} must be >= 1")
        if not 1 <= self.base_budget <= self.tuner.k_max:
            raise ValueError(f"BenchSetup.base_budget={self.base_budget} outside [1, largest "
                             f"bucket {self.tuner.k_max}]")
        if self.bus_bytes_per_s <= 0:
            raise ValueError("BenchSetup.bus_bytes_per_s must be positive")

    def geometry(self, block_size: int) -> batching.StepGeometry:
        return batching.StepGeometry(self.num_shards, self.micro_batches,
                                     self.rows_per_micro_batch, self.row_len, block_size)


def allreduce_seconds(param_bytes: int, num_shards: int, bus_bytes_per_s: float) -> float:
    """Ring all-reduce time of `param_bytes` of gradients over `num_shards` ranks."""
    return 2.0 * (num_shards - 1) / num_shards * param_bytes / bus_bytes_per_s


def collect_documents(spec: DataSpec, setup: BenchSetup, block_size: int) -> list[dict]:
    """The stream's first documents that fill `steps` global batches (the window rule)."""
    geometry = setup.geometry(block_size)
    target = setup.steps * batching.step_capacity_tokens(geometry, setup.fill)
    source = document_dataset(spec, setup.seed)
    docs, tokens = [], 0
    for i in range(len(source)):
        doc = source[i]
        a = aligned_length(len(doc["inputs"]), block_size)
        if not batching.window_accepts(tokens, a, target):
            return docs
        docs.append(doc)
        tokens += a
    raise AssertionError("unreachable: the document stream is unbounded")


def plan_steps(docs: list[dict], batcher: str, setup: BenchSetup, block_size: int,
               cost_model: LatencyModel) -> list[dict[str, np.ndarray]]:
    """Step batches [S, M, R, T] of `docs` planned by `batcher` as one window."""
    stream = grain.MapDataset.source(docs).to_iter_dataset()
    steps = batching.make_batcher(
        batcher, stream, num_shards=setup.num_shards, micro_batches=setup.micro_batches,
        rows_per_micro_batch=setup.rows_per_micro_batch, row_len=setup.row_len,
        align=block_size, base_budget=setup.base_budget, window=setup.steps,
        cost_model=cost_model, seed=setup.seed, fill=setup.fill)
    return list(steps)


def _fwd_bwd(params, batch, *, model_cfg: ModelConfig, attention_cfg: AttentionConfig,
             k_max: int):
    return loss_and_grads(Transformer(model_cfg, attention_cfg, k_max), params, batch)


class DeviceRunner:
    """The model on the device: initial parameters, timed micro-batch fwd+bwd, layer-0 coverage.

    One instance serves every row and workload, so its `CompileCache` counts each real compile
    once; `used` records which compiled steps a row ran.
    """

    def __init__(self, cfg: Config, seed: int):
        buckets = cfg.attention.budget_buckets
        model = Transformer(cfg.model, cfg.attention, buckets[-1])
        init_len = min(cfg.data.seq_len, buckets[-1] * cfg.attention.block_size)
        inputs = dummy_inputs(1, init_len)
        self.params = jax.jit(lambda r: nn.meta.unbox(model.init(r, *inputs))["params"])(
            jax.random.key(seed))
        self.param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.params))
        jitted = jax.jit(functools.partial(_fwd_bwd, model_cfg=cfg.model,
                                           attention_cfg=cfg.attention),
                         static_argnames="k_max")
        self.cache = CompileCache(jitted, buckets)
        # The decision's probe (budgets up to the base) and the report's (every bucket budget,
        # every token: it is not timed).
        self._coverage = {"decision": CoverageProbe(cfg, model),
                          "report": CoverageProbe(cfg, model, cfg.attention.budget_buckets[-1],
                                                  query_stride=1)}

    @property
    def compiles(self) -> int:
        return self.cache.compiles

    def time_micro_batch(self, bucket: int, mb: dict[str, jax.Array], repeats: int,
                         used: set) -> float:
        """Median seconds of one micro-batch's forward+backward, compiled for `bucket`."""
        compiled = self.cache.compiled(bucket, self.params, mb)
        used.add((bucket, tuple(mb["inputs"].shape)))
        return time_call(compiled, self.params, mb, warmup=1, repeats=repeats)

    def measure_step(self, step_batch: dict[str, np.ndarray], budgets_S: np.ndarray,
                     bucket: int, setup: BenchSetup, used: set) -> dict[str, Any]:
        """One synchronous step, simulated: every (shard, micro-batch) timed in turn; the step
        is the slowest shard plus the modeled all-reduce."""
        S, M = setup.num_shards, setup.micro_batches
        measured_SM = np.zeros((S, M))
        for s in range(S):
            for m in range(M):
                mb = _micro_batch(step_batch, s, m, int(budgets_S[s]))
                measured_SM[s, m] = self.time_micro_batch(bucket, mb, setup.repeats, used)
        measured_S = measured_SM.sum(axis=1)
        allreduce = allreduce_seconds(self.param_bytes, S, setup.bus_bytes_per_s)
        return dict(measured_SM=measured_SM.tolist(), measured_S=measured_S.tolist(),
                    step_seconds=float(measured_S.max() + allreduce),
                    allreduce_seconds=allreduce)

    def shard_coverage(self, step_batch: dict[str, np.ndarray], use: str = "decision"
                       ) -> np.ndarray:
        """Coverage float64 [S, K] of every shard's rows at every budget (token-weighted;
        column k - 1: budget k) up to the base budget ("decision", the train loop's probe) or
        the largest bucket ("report")."""
        return np.asarray(self._coverage[use](step_batch, self.params), np.float64)

    def decision_coverage(self, step_batch: dict[str, np.ndarray], repeats: int
                          ) -> tuple[np.ndarray, float]:
        """The decision's coverage ("decision" [S, K]) and what a data-parallel step pays for
        its probe: the loop dispatches it while the step before runs (`DstBalancer.prefetch`),
        each device probing its own shard, so a step pays the device's time on one shard's
        probe, its host part hidden - measured here on each shard's rows alone
        (`CoverageProbe.device_seconds`), the slowest shard's."""
        probe = self._coverage["decision"]
        seconds = []
        for s in range(step_batch["inputs"].shape[0]):
            shard = {k: step_batch[k][s:s + 1] for k in CoverageProbe.INPUTS}
            seconds.append(probe.device_seconds(shard, self.params, repeats=repeats))
        return self.shard_coverage(step_batch), max(seconds)


def _micro_batch(step_batch: dict[str, np.ndarray], s: int, m: int,
                 budget: int) -> dict[str, jax.Array]:
    """Shard s's micro-batch m in the step layout [1, R, T] (budgets [1, R]), on the device."""
    mb = {k: step_batch[k][s, m][None] for k in BATCH_KEYS if k != "budgets"}
    mb["budgets"] = np.full((1, step_batch["inputs"].shape[2]), budget, np.int32)
    return jax.device_put(mb)


def run_method(method: Method, step_batches: list[dict[str, np.ndarray]], setup: BenchSetup,
               runner, cost_model: LatencyModel,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one row over its step batches; returns {"steps": [per-step records], "summary"}.
    `runner` measures each step: a DeviceRunner (simulated), or a mesh_runner.MeshRunner (one
    shard per device)."""
    S = setup.num_shards
    config = dataclasses.replace(setup.tuner, enabled=method.dst)
    tuner = Tuner(config, S, ema_decay=setup.ema_decay)
    padded = setup.rows_per_micro_batch * setup.row_len
    used: set = set()
    records = []
    for t, batch in enumerate(step_batches):
        # The decision as the train loop pays it before every step: the latency table and the
        # rule, timed on the host, and the coverage probe, which the loop prefetched behind the
        # step before - charged its device time (runner.decision_coverage), every DST step.
        curve_SK, probe_seconds = (runner.decision_coverage(batch, setup.repeats) if method.dst
                                   else (None, 0.0))
        start = time.perf_counter()
        seconds_SK = shard_latency_table(
            batch["doc_lengths"], cost_model, config.k_max, padded_tokens=padded,
            budget_range=budget_bounds(setup.base_budget, config.p, config.k_max))
        decision = tuner.decide(setup.base_budget, seconds_SK, coverage=curve_SK)
        host_seconds = time.perf_counter() - start
        tuner_seconds = host_seconds + probe_seconds if method.dst else 0.0
        coverage_S_K = runner.shard_coverage(batch, "report")  # report only: not timed
        coverage_S = coverage_S_K[np.arange(S), decision.budgets_S - 1]

        timing = runner.measure_step(batch, decision.budgets_S, decision.bucket, setup, used)
        runner_step_seconds = timing.pop("step_seconds")
        measured_S = np.asarray(timing["measured_S"])
        predicted_uncorrected_S = seconds_SK[np.arange(S), decision.budgets_S]
        tuner.observe(measured_S, predicted_uncorrected_S)
        record = dict(
            step=t, bucket=decision.bucket, budgets_S=decision.budgets_S.tolist(), **timing,
            runner_step_seconds=runner_step_seconds,
            step_seconds=runner_step_seconds + tuner_seconds,
            predicted_before_S=decision.predicted_before_S.tolist(),
            predicted_after_S=decision.predicted_after_S.tolist(),
            predicted_uncorrected_S=predicted_uncorrected_S.tolist(),
            batcher_predicted_S=batch["predicted_seconds"].sum(axis=1).tolist(),
            coverage_S=coverage_S.tolist(),
            tokens_S=(batch["segment_ids"] != 0).reshape(S, -1).sum(-1).tolist(),
            imbalance=float(measured_S.max() / measured_S.mean()),
            tuner_seconds=tuner_seconds, coverage_seconds=probe_seconds,
            coverage_calls=int(method.dst),
            doc_ids=sorted(int(i) for i in batch["doc_ids"].ravel() if i >= 0))
        records.append(record)
        log(f"  {method.name:>9} step {t + 1}/{len(step_batches)}: shards "
            f"{1e3 * measured_S.min():.1f}-{1e3 * measured_S.max():.1f} ms, imbalance "
            f"{record['imbalance']:.3f}, budgets {decision.budgets_S.tolist()}")
    return {"steps": records, "summary": _summarize(records, len(used), len(config.buckets))}


def _imbalance(x_TS: np.ndarray) -> float:
    return float(np.mean(x_TS.max(axis=1) / x_TS.mean(axis=1)))


def _summarize(records: list[dict], compiles: int, buckets: int) -> dict[str, Any]:
    measured_TS = np.array([r["measured_S"] for r in records])
    before_TS = np.array([r["predicted_before_S"] for r in records])
    after_TS = np.array([r["predicted_after_S"] for r in records])
    tokens_TS = np.array([r["tokens_S"] for r in records], dtype=np.float64)
    coverage_TS = np.array([r["coverage_S"] for r in records])
    step_T = np.array([r["step_seconds"] for r in records])
    tuner_T = np.array([r["tuner_seconds"] for r in records])
    coverage_T = np.array([r["coverage_seconds"] for r in records])
    # The EMA has seen no measurement before the first step; its error counts from step 2 on.
    error = (np.abs(after_TS[1:] - measured_TS[1:]) / measured_TS[1:]) if len(records) > 1 \
        else np.full((1,), np.nan)
    doc_ids = [i for r in records for i in r["doc_ids"]]
    return dict(
        steps=len(records),
        imbalance=_imbalance(measured_TS),
        predicted_imbalance_before=_imbalance(before_TS),
        predicted_imbalance_after=_imbalance(after_TS),
        mean_step_seconds=float(step_T.mean()), total_seconds=float(step_T.sum()),
        mean_max_shard_seconds=float(measured_TS.max(axis=1).mean()),
        tuner_ms=float(1e3 * tuner_T.mean()),
        tuner_pct=float(100 * tuner_T.sum() / step_T.sum()),
        coverage_ms=float(1e3 * coverage_T.mean()),
        compiles=compiles, buckets=buckets,
        mean_budget=float(np.mean([r["budgets_S"] for r in records])),
        mean_coverage=float((coverage_TS * tokens_TS).sum() / tokens_TS.sum()),
        min_shard_coverage=float(coverage_TS.min()),
        prediction_error=float(np.mean(error)),
        documents=len(doc_ids), distinct_documents=len(set(doc_ids)))


def run_workload(spec: DataSpec, setup: BenchSetup, runner,
                 cost_model: LatencyModel, block_size: int,
                 log: Callable[[str], None] = print,
                 methods: Sequence[Method] = METHODS) -> dict[str, Any]:
    """The rows of `methods` (the baseline first) on one document stream; speedups relative to
    the baseline."""
    if methods[0] != METHODS[0]:
        raise ValueError(f"the rows start with the baseline {METHODS[0].name!r}")
    docs = collect_documents(spec, setup, block_size)
    lengths = [len(d["inputs"]) for d in docs]
    log(f"{spec.length_distribution}: {len(docs)} documents, {sum(lengths)} tokens, lengths "
        f"{min(lengths)}-{max(lengths)} (median {int(np.median(lengths))})")
    plans = {b: plan_steps(docs, b, setup, block_size, cost_model)
             for b in sorted({m.batcher for m in methods})}
    steps = {b: len(plan) for b, plan in plans.items()}
    if len(set(steps.values())) != 1:  # Speedup compares totals: same data, same steps.
        raise ValueError(f"the batchers planned different step counts {steps} for the same "
                         f"documents; rerun with another --steps")
    rows = {}
    for method in methods:
        rows[method.name] = run_method(method, plans[method.batcher], setup, runner,
                                       cost_model, log)
    baseline_total = rows[METHODS[0].name]["summary"]["total_seconds"]
    for row in rows.values():
        summary = row["summary"]
        summary["speedup"] = baseline_total / summary["total_seconds"]
        summary["every_document_once"] = (summary["documents"] == len(docs)
                                          == summary["distinct_documents"])
    return {"documents": len(docs), "doc_lengths": lengths, "rows": rows}


def recount_decision(data: dict[str, Any]) -> dict[str, Any]:
    """A `bench_balance.json` written before a DST row's step paid its decision, counted as
    `run_method` counted before the loop prefetched the probe: the step pays the decision's
    synchronous probe call, on the steps that weighed a cut. Returns the same {"settings",
    "workloads"} with new records and summaries (speedups included).

    In such a file a step's `step_seconds` is the runner's step alone, `tuner_seconds` the
    decision's host time without its coverage probes, and `coverage_seconds` the device time of
    every probe call of the step: the decision's, and those made only to report the chosen
    budgets' coverage (one per chosen budget the decision had not probed). Which calls were the
    decision's follows from the rule (`tuner`, rule 3): it probes when it weighs lowering a
    shard, from the lower bound `lo` up until the shard's coverage meets the floor. Taken here:
    a step probed only if it lowered a shard, and then with one call, at `lo` (every lowered
    shard met the floor there), so a step made |{lo} u {chosen budgets}| calls, or |{chosen
    budgets}| when no shard was lowered. A step whose floor held a weighed shard at the base
    made decision calls this charges nothing for; in the stored runs none did (the per-call time
    of the steps that lowered none matches one call per chosen budget). Every call
    is the same compiled probe on the same inputs (only the budget, data, differs), so the
    decision's share is taken as the step's `coverage_seconds` split evenly over its calls
    (the gate's passes follow the budget, so the call at `lo` is if anything the cheaper one).
    """
    settings = data["settings"]
    if any("runner_step_seconds" in r for w in data["workloads"].values()
           for row in w["rows"].values() for r in row["steps"]):
        raise ValueError("these results already count the decision in the step")
    base, buckets = settings["base_budget"], tuple(settings["buckets"])
    lo, _ = budget_bounds(base, settings["p"], buckets[-1])
    dst = {m.name: m.dst for m in METHODS}
    workloads = {}
    for name, workload in data["workloads"].items():
        rows = {}
        for method, row in workload["rows"].items():
            records = []
            for r in row["steps"]:
                lowered = min(r["budgets_S"]) < base
                calls = len(({lo} if lowered else set()) | set(r["budgets_S"]))
                probe = r["coverage_seconds"] * lowered / calls if dst[method] else 0.0
                tuner_seconds = r["tuner_seconds"] + probe if dst[method] else 0.0
                records.append(dict(r, runner_step_seconds=r["step_seconds"],
                                    step_seconds=r["step_seconds"] + tuner_seconds,
                                    tuner_seconds=tuner_seconds, coverage_seconds=probe,
                                    coverage_calls=int(lowered and dst[method])))
            summary = dict(row["summary"], **_summarize(records, row["summary"]["compiles"],
                                                         len(buckets)))
            rows[method] = {"steps": records, "summary": summary}
        baseline_total = rows[METHODS[0].name]["summary"]["total_seconds"]
        for row in rows.values():
            row["summary"]["speedup"] = baseline_total / row["summary"]["total_seconds"]
        workloads[name] = dict(workload, rows=rows)
    return {"settings": settings, "workloads": workloads}
