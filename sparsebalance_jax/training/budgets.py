"""Per-step budget decisions for the loop: fixed base budgets, or DST-tuned per-shard budgets.

A decision carries the per-row budgets `[S, M, R]` the kernel receives as data and the static
bucket (k_max) that selects the compiled step.
"""

from __future__ import annotations

import dataclasses

import time

import numpy as np


@dataclasses.dataclass(frozen=True)
class BudgetDecision:
    budgets: np.ndarray  # int32 [S, M, R] for this process's shards
    bucket: int
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    # The latency model's uncorrected prediction per shard at the chosen budgets (DST only):
    # what a measured shard time is compared with to update the EMA correction.
    predicted_S: np.ndarray | None = None
    # Every shard's budget (DST decides for all shards of the job; logged by process 0).
    shard_budgets_S: np.ndarray | None = None

    def scalars(self) -> dict[str, float]:
        per_shard = (self.shard_budgets_S if self.shard_budgets_S is not None else
                     self.budgets.reshape(self.budgets.shape[0], -1).mean(axis=1))
        out = {f"budget/shard{s}": float(b) for s, b in enumerate(per_shard)}
        out["budget/bucket"] = float(self.bucket)
        out.update(self.extra)
        return out


class FixedBudgets:
    """The batcher's base budgets unchanged (DST off): one bucket, one compiled step."""

    def __init__(self, bucket: int):
        self.bucket = bucket

    def prefetch(self, next_batch, params) -> None:
        del next_batch, params  # nothing to prepare: the next batch is not even read early

    def decide(self, step_batch: dict, params) -> BudgetDecision:
        del params
        return BudgetDecision(np.asarray(step_batch["budgets"], np.int32), self.bucket)

    def observe(self, decision: BudgetDecision, shard_seconds: np.ndarray | None) -> None:
        del decision, shard_seconds

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        del state


def tuner_config(cfg):
    """The DST tuner's settings from a `Config` (its `balance` section and budget buckets)."""
    from sparsebalance_jax.balance.tuner import TunerConfig

    b = cfg.balance
    return TunerConfig(anchor=b.anchor, p=b.p, coverage_floor=b.coverage_floor,
                       buckets=cfg.attention.budget_buckets, dead_band=b.dead_band,
                       raise_within_bucket=b.raise_within_bucket)


class DstBalancer:
    """Dynamic sparsity tuning in the loop: one budget per data shard, each step.

    Predictions: the latency model prices every shard's micro-batches at every budget
    (`shard_latency_table`). Coverage floor: the first layer's MoBA gate, run on this step's
    inputs with the parameters the step begins with, gives each shard's coverage at every
    budget in one device call (`launch.CoverageProbe`). The loop starts that call for the next
    step batch while the current step runs (`prefetch`, with the parameters the step is
    computing), so that its host work overlaps the step and `decide` finds it ready; a step
    with nothing prefetched (the first) probes when the tuner weighs lowering a shard. The
    tuner's EMA correction (and the dead band's measured error) is fed each shard's measured
    compute time when the loop times shards (`balance.shard_timing`,
    `training.step.ShardTimedStep`); without it the decisions rest on the model's predictions
    alone.
    """

    def __init__(self, cfg, cost_model, coverage_fn, *, gather=None, first_shard: int = 0):
        """`coverage_fn(step_batch, params)` -> [S_local, >= base budget] coverage of this
        process's shards at every budget from 1;
        `gather` turns a process-local [S_local, ...] array into the job's [S, ...] (identity
        with one process); `first_shard` is this process's first data shard."""
        from sparsebalance_jax.balance.tuner import Tuner

        self._tuner = Tuner(tuner_config(cfg), cfg.num_data_shards,
                            ema_decay=cfg.balance.ema_decay)
        self._cost_model = cost_model
        self._coverage_fn = coverage_fn
        self._gather = gather or (lambda x: x)
        self._first_shard = first_shard
        self._base = cfg.attention.budget
        self._k_max = cfg.attention.budget_buckets[-1]
        self._padded_tokens = cfg.data.rows_per_micro_batch * cfg.data.seq_len
        self._prefetched = None  # (step batch, parameters, the probe dispatched on them)

    def prefetch(self, next_batch, params) -> None:
        """Starts the coverage probe of the next step's batch (`next_batch()`, None where it
        could not be read: then nothing) with `params`, the parameters that step will begin
        with (the current step's outputs, possibly still being computed: the probe queues
        behind it on the device)."""
        step_batch = next_batch()
        if step_batch is not None:
            self._prefetched = (step_batch, params, self._coverage_fn(step_batch, params))

    def decide(self, step_batch: dict, params) -> BudgetDecision:
        from sparsebalance_jax.balance.tuner import (LazyCoverage, budget_bounds,
                                                     shard_latency_table)

        start = time.perf_counter()
        # Every process decides for every shard from the same gathered inputs, so all reach the
        # same budgets (and issue the same gathers in the same order).
        seconds_SK = shard_latency_table(
            self._gather(step_batch["doc_lengths"]), self._cost_model, self._k_max,
            self._padded_tokens,
            budget_range=budget_bounds(self._base, self._tuner.config.p, self._k_max))
        ahead = self._prefetched
        self._prefetched = None
        hit = ahead is not None and ahead[0] is step_batch and ahead[1] is params
        coverage = LazyCoverage(lambda: self._gather(np.asarray(
            ahead[2] if hit else self._coverage_fn(step_batch, params))))
        d = self._tuner.decide(self._base, seconds_SK, coverage)
        cov_S = coverage.curve[:, self._base - 1] if coverage.curve is not None else None
        local_S = d.budgets_S[self._first_shard:self._first_shard + len(step_batch["budgets"])]
        budgets_SMR = np.broadcast_to(local_S[:, None, None],
                                      step_batch["budgets"].shape).astype(np.int32)
        before, after = d.predicted_before_S, d.predicted_after_S
        # Overhead: the whole decision on the host - latency table, the rule, and the gate
        # probe it asked for: waiting for a prefetched one, or the whole call (device time
        # included) where none was.
        extra = {"tuner/overhead_ms": 1e3 * (time.perf_counter() - start),
                 "tuner/probe_prefetched": float(hit),
                 "tuner/imbalance_predicted_before": float(before.max() / before.mean()),
                 "tuner/imbalance_predicted_after": float(after.max() / after.mean())}
        for s, (t0, t1) in enumerate(zip(before, after)):
            extra[f"predicted_ms/shard{s}_base"] = 1e3 * t0
            extra[f"predicted_ms/shard{s}_tuned"] = 1e3 * t1
        if cov_S is not None:
            extra.update({f"coverage/shard{s}_base": float(c) for s, c in enumerate(cov_S)})
        chosen_S = seconds_SK[np.arange(len(d.budgets_S)), d.budgets_S]
        return BudgetDecision(budgets_SMR, d.bucket, extra, predicted_S=chosen_S,
                              shard_budgets_S=d.budgets_S.astype(np.float64))

    def observe(self, decision: BudgetDecision, shard_seconds: np.ndarray | None) -> None:
        if shard_seconds is not None:
            self._tuner.observe(np.asarray(shard_seconds), decision.predicted_S)

    def get_state(self) -> dict:
        return self._tuner.state_dict()

    def set_state(self, state: dict) -> None:
        if not state:  # Saved by a run with balance.dst off, resumed with it on.
            print("note: the checkpoint holds no DST tuner state (it was written with "
                  "balance.dst off); the tuner starts afresh", flush=True)
            return
        saved_units = np.shape(state["history_budgets_HS"])[1:]
        units = self._tuner.history_budgets_HS.shape[1:]
        if saved_units != units:  # A resume with another shard count (resume_with_changes).
            print(f"note: the checkpoint's DST tuner state is for {saved_units[0]} data shards, "
                  f"this run has {units[0]}; its per-shard latency corrections do not carry "
                  "over: the tuner starts afresh", flush=True)
            return
        self._tuner.load_state_dict(state)
