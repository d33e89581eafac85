"""Dynamic sparsity tuning (DST): per-shard MoBA budgets that pull every shard toward one latency.

Owns the tuner's configuration, its decision rule (`decide`), the bucket rule (`bucket_for`)
and the tuner's checkpointable state (`Tuner`: EMA correction + decision history).

"Shard" here is any unit that runs concurrently and is waited for: the train loop passes data
shards, or data shards x micro-batches flattened; `decide` only sees a flat axis of N units.

The decision, per unit s with predicted latency L_s at the base budget b and anchor A
(mean, min or max of the L_s):

1. Bounds: a budget moves by at most ceil(p * b) either way, and stays within [1, max
   bucket]: [lo, hi] = [max(1, b - ceil(p b)), min(k_max, b + ceil(p b))]. Rounding up keeps
   small bases movable (b = 3, p = 0.3 may move by one block), so the bound is p * b rounded
   up to whole blocks.
2. Toward the anchor: a straggler (L_s > A) takes the budget b' in [lo, b] whose predicted
   latency is closest to A (ties: the larger budget), so a unit barely above the anchor keeps
   its budget instead of dropping a whole block below it (which would cost accuracy and only
   make it the light one); a light unit (L_s < A) takes the largest b' >= b whose latency is
   still <= A (it fills its bubble, never becoming the new straggler), except that of budgets
   predicted equally fast it keeps the smallest: a raise that adds no predicted time adds no
   attention either (its documents have fewer blocks than the budget), and it could only push
   the step into a larger bucket. Latency is taken to be non-decreasing in the budget (the
   light unit's scan stops at the first budget that crosses the anchor; profiled tables are
   made so, `latency.LatencyTable`).
3. Coverage floor: a budget is never lowered below the smallest budget whose coverage (share
   of the gate's score mass held by the selected blocks) reaches the floor. The floor only
   stops decreases: it does not raise a budget above the base (the base is the accuracy the
   user chose; if the base already misses the floor, the unit stays at the base or above).
4. Dead band: a prediction is only as good as its error, so a unit moves only when its gap to
   the anchor exceeds its band e_s = max(dead_band, the EMA of its corrected prediction's
   relative error): a straggler when L_s > A (1 + e_s), a light unit when L_s < A (1 - e_s),
   and a light unit rises only to budgets predicted at or below A (1 - e_s), so the error
   alone cannot make it the new straggler. Inside the band the unit keeps the base budget.
5. Raising stays within the base's bucket (`raise_within_bucket`, default on): a light unit
   rises at most to the largest budget of the smallest bucket holding the base. Every unit
   of a step runs the program compiled for the step's largest budget, and a larger k_max costs
   every unit, raised or not: on an H200 at 32K rows, block 512, shards whose budget stayed 16
   ran 1-4% slower in steps pushed into bucket 24 by a raised shard (BENCHMARKS.md). A
   raise buys accuracy for the light unit only, so it must not slow the whole step down.
6. Budgets are data: any integer in [1, k_max]. The static k_max the step is compiled for is
   the bucket: the smallest configured bucket >= the step's largest budget (`bucket_for`), so
   the number of distinct compiled programs is bounded by the number of buckets.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping

import numpy as np

from sparsebalance_jax.balance.latency import EmaCorrection, LatencyModel

ANCHORS = ("mean", "min", "max")

LatencyFn = Callable[[int, int], float]  # (unit, budget) -> predicted seconds
CoverageFn = Callable[[int, int], float]  # (unit, budget) -> coverage in [0, 1]


@dataclasses.dataclass(frozen=True)
class TunerConfig:
    anchor: str = "mean"
    p: float = 0.2
    coverage_floor: float = 0.9
    buckets: tuple[int, ...] = (16, 32, 48, 64)
    enabled: bool = True
    dead_band: float = 0.0  # least relative gap to the anchor that moves a unit (rule 4)
    raise_within_bucket: bool = True  # rule 5

    def __post_init__(self):
        if self.anchor not in ANCHORS:
            raise ValueError(f"TunerConfig.anchor={self.anchor!r} not in {ANCHORS}")
        if not 0.1 <= self.p <= 0.3:
            raise ValueError(f"TunerConfig.p={self.p} must be in [0.1, 0.3]")
        if not 0.0 <= self.dead_band < 1.0:
            raise ValueError(f"TunerConfig.dead_band={self.dead_band} not in [0, 1)")
        if not 0.0 <= self.coverage_floor <= 1.0:
            raise ValueError(f"TunerConfig.coverage_floor={self.coverage_floor} not in [0, 1]")
        if (not self.buckets or list(self.buckets) != sorted(set(self.buckets))
                or self.buckets[0] < 1):
            raise ValueError(f"TunerConfig.buckets={self.buckets} must be >= 1, strictly "
                             "increasing and non-empty")

    @property
    def k_max(self) -> int:
        return self.buckets[-1]


def bucket_for(budgets: np.ndarray, buckets: tuple[int, ...]) -> int:
    """The static k_max to compile for: the smallest bucket >= the largest budget."""
    top = int(np.max(budgets))
    for b in buckets:
        if b >= top:
            return b
    raise ValueError(f"budget {top} exceeds the largest bucket {buckets[-1]}")


def budget_bounds(base_budget: int, p: float, k_max: int) -> tuple[int, int]:
    step = math.ceil(p * base_budget - 1e-9)  # tolerance: 0.3 * 20 is 6.000000000000001
    return max(1, base_budget - step), min(k_max, base_budget + step)


def anchor_latency(predicted_S: np.ndarray, anchor: str) -> float:
    return float({"mean": np.mean, "min": np.min, "max": np.max}[anchor](predicted_S))


def shard_latency_table(doc_lengths_SMD: np.ndarray, cost_model: LatencyModel,
                        k_max: int, padded_tokens: int | None = None,
                        budget_range: tuple[int, int] | None = None) -> np.ndarray:
    """Predicted seconds float64 [S, k_max + 1] of each shard's micro-batches summed, at every
    budget 0..k_max (column 0 unused), from a step batch's `doc_lengths` [S, M, D]: one
    vectorised pass, so `decide` then only looks values up. `budget_range` = (lo, hi) prices
    only those budgets (the tuner's `budget_bounds`, all it can choose); other columns are NaN."""
    S, M, D = doc_lengths_SMD.shape
    lo, hi = budget_range or (1, k_max)
    if not 1 <= lo <= hi <= k_max:
        raise ValueError(f"budget_range ({lo}, {hi}) outside [1, k_max={k_max}]")
    seconds_KB = cost_model.predict_per_budget(np.reshape(doc_lengths_SMD, (S * M, D)),
                                               np.arange(lo, hi + 1), padded_tokens=padded_tokens)
    seconds_SK = np.full((S, k_max + 1), np.nan)
    seconds_SK[:, lo:hi + 1] = seconds_KB.reshape(-1, S, M).sum(axis=2).T
    return seconds_SK


def _as_coverage_fn(coverage: np.ndarray | CoverageFn | None) -> CoverageFn | None:
    """coverage_SK[s, j] is unit s's coverage at budget j + 1; or a callable; or None (no floor)."""
    if coverage is None or callable(coverage):
        return coverage
    coverage_SK = np.asarray(coverage, dtype=np.float64)
    if coverage_SK.ndim != 2:
        raise ValueError(f"coverage_by_budget must be [units, k_max], got {coverage_SK.shape}")

    def fn(unit: int, budget: int) -> float:
        if budget > coverage_SK.shape[1]:
            raise ValueError(f"coverage_by_budget holds budgets 1..{coverage_SK.shape[1]}; the "
                             f"rule asked for budget {budget} (probe up to the base budget)")
        return float(coverage_SK[unit, budget - 1])
    return fn


class LazyCoverage:
    """A CoverageFn over one probe of every unit at every budget (`probe()` -> [units, K],
    column k - 1: budget k), made on the first question - the rule asks only when it weighs
    lowering a unit, so a step that weighs none makes no probe. `curve` holds the probe's
    result (None if none was made)."""

    def __init__(self, probe: Callable[[], np.ndarray]):
        self._probe = probe
        self.curve: np.ndarray | None = None

    def __call__(self, unit: int, budget: int) -> float:
        if self.curve is None:
            self.curve = np.asarray(self._probe(), np.float64)
        return float(self.curve[unit, budget - 1])


def _floor_budget(coverage_fn: CoverageFn | None, unit: int, floor: float, lo: int,
                  base: int) -> int:
    """Smallest budget in [lo, base] meeting the coverage floor (base if none below it does)."""
    if coverage_fn is None:
        return lo
    for k in range(lo, base + 1):  # coverage rises with k; the range is at most p * base long
        if coverage_fn(unit, k) >= floor:
            return k
    return base


def decide(predicted_S: np.ndarray, base_budget: int, coverage: np.ndarray | CoverageFn | None,
           latency_fn: LatencyFn, config: TunerConfig,
           error_S: np.ndarray | None = None) -> np.ndarray:
    """Per-unit budgets int32 [N]; see the module docstring for the rule. `error_S` is each
    unit's measured relative prediction error (rule 4; none: only config.dead_band)."""
    predicted_S = np.asarray(predicted_S, dtype=np.float64)
    if not 1 <= base_budget <= config.k_max:
        raise ValueError(f"base_budget={base_budget} outside [1, k_max={config.k_max}]")
    if not config.enabled:
        return np.full(predicted_S.shape, base_budget, dtype=np.int32)
    band_S = np.full(predicted_S.shape, config.dead_band)
    if error_S is not None:
        band_S = np.maximum(band_S, np.asarray(error_S, dtype=np.float64))
    coverage_fn = _as_coverage_fn(coverage)
    lo, hi = budget_bounds(base_budget, config.p, config.k_max)
    if config.raise_within_bucket:
        hi = min(hi, bucket_for(np.array([base_budget]), config.buckets))
    target = anchor_latency(predicted_S, config.anchor)
    budgets = []
    # Python floats, not numpy scalars: the per-unit scan is a few dozen scalar comparisons,
    # which numpy scalars make several times slower (the decision runs every step).
    for s, (latency, band) in enumerate(zip(predicted_S.tolist(), band_S.tolist())):
        if latency > target * (1.0 + band):
            # Scan down from the base; the first minimum wins, so ties keep the larger budget.
            chosen, gap = base_budget, latency - target
            for k in range(base_budget - 1, lo - 1, -1):
                k_latency = latency_fn(s, k)
                k_gap = abs(k_latency - target)
                if k_gap < gap:
                    chosen, gap = k, k_gap
                if k_latency <= target:
                    break  # lower budgets only move further below the anchor
        elif latency < target * (1.0 - band):
            chosen, chosen_latency = base_budget, latency
            for k in range(base_budget + 1, hi + 1):
                k_latency = latency_fn(s, k)
                if k_latency > target * (1.0 - band):
                    break
                if k_latency > chosen_latency:  # ties keep the smaller budget
                    chosen, chosen_latency = k, k_latency
        else:
            chosen = base_budget
        if chosen < base_budget:
            chosen = max(chosen, _floor_budget(coverage_fn, s, config.coverage_floor, lo,
                                               base_budget))
        budgets.append(chosen)
    return np.array(budgets, dtype=np.int32)


@dataclasses.dataclass(frozen=True)
class Decision:
    budgets_S: np.ndarray  # int32 [N], data for the kernel
    bucket: int  # static k_max to run the step with
    anchor_seconds: float
    predicted_before_S: np.ndarray  # corrected predictions at the base budget
    predicted_after_S: np.ndarray  # corrected predictions at the chosen budgets
    host_seconds: float  # time spent in the decision (tuner overhead)


class Tuner:
    """`decide` plus the online EMA correction and a bounded history; checkpointable."""

    def __init__(self, config: TunerConfig, num_units: int, *, ema_decay: float = 0.9,
                 history: int = 256):
        self.config = config
        self.ema = EmaCorrection(num_units, ema_decay)
        self.num_units = num_units
        self.step = 0
        self.history_budgets_HS = np.zeros((history, num_units), dtype=np.int32)
        self.history_imbalance_H2 = np.zeros((history, 2), dtype=np.float64)  # before, after

    def decide(self, base_budget: int, seconds_SK: np.ndarray,
               coverage: np.ndarray | CoverageFn | None = None) -> Decision:
        """seconds_SK float [N, >= k_max + 1]: each unit's uncorrected model prediction at every
        budget k in column k (`shard_latency_table`; only budgets within the bounds are read)."""
        start = time.perf_counter()
        seconds_SK = np.asarray(seconds_SK, dtype=np.float64)
        if seconds_SK.ndim != 2 or seconds_SK.shape[0] != self.num_units or (
                seconds_SK.shape[1] <= self.config.k_max):
            raise ValueError(f"seconds_SK: need [{self.num_units}, >= {self.config.k_max + 1}] "
                             f"(units x budgets 0..k_max), got {seconds_SK.shape}")
        lo, hi = (budget_bounds(base_budget, self.config.p, self.config.k_max)
                  if self.config.enabled else (base_budget, base_budget))
        read_SK = seconds_SK[:, lo:hi + 1]
        if not np.all(np.isfinite(read_SK) & (read_SK > 0)):
            raise ValueError(f"seconds_SK must hold positive, finite predictions at budgets "
                             f"{lo}..{hi} (the bounds around base budget {base_budget}), the "
                             "ones the rule may read; shard_latency_table prices them with "
                             "budget_range=budget_bounds(...)")
        corrected_SK = seconds_SK * self.ema.ratio_S[:, None]
        before_S = corrected_SK[:, base_budget]
        corrected_rows = corrected_SK.tolist()  # cheap scalar look-ups for the rule's scan
        budgets_S = decide(before_S, base_budget, coverage, lambda s, k: corrected_rows[s][k],
                           self.config, error_S=self.ema.error_S)
        after_S = corrected_SK[np.arange(self.num_units), budgets_S]
        bucket = bucket_for(budgets_S, self.config.buckets)
        row = self.step % len(self.history_budgets_HS)
        self.history_budgets_HS[row] = budgets_S
        self.history_imbalance_H2[row] = (before_S.max() / before_S.mean(),
                                         after_S.max() / after_S.mean())
        self.step += 1
        return Decision(budgets_S=budgets_S, bucket=bucket,
                        anchor_seconds=anchor_latency(before_S, self.config.anchor),
                        predicted_before_S=before_S, predicted_after_S=after_S,
                        host_seconds=time.perf_counter() - start)

    def observe(self, measured_S: np.ndarray, predicted_uncorrected_S: np.ndarray) -> None:
        """Feed the measured per-unit times of the step just run (at the budgets it used)."""
        self.ema.update(measured_S, predicted_uncorrected_S)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable (nested lists and numbers)."""
        return {"ema": self.ema.state_dict(), "step": self.step,
                "history_budgets_HS": self.history_budgets_HS.tolist(),
                "history_imbalance_H2": self.history_imbalance_H2.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name in ("history_budgets_HS", "history_imbalance_H2"):
            if np.shape(state[name]) != getattr(self, name).shape:
                raise ValueError(f"tuner state's {name} has shape {np.shape(state[name])}, this "
                                 f"tuner's {getattr(self, name).shape}: saved with a different "
                                 "unit count or history length")
        self.ema.load_state_dict(state["ema"])
        self.step = int(state["step"])
        self.history_budgets_HS = np.asarray(state["history_budgets_HS"], np.int32).copy()
        self.history_imbalance_H2 = np.asarray(state["history_imbalance_H2"], np.float64).copy()
