"""Per-step budget decisions for the loop: fixed base budgets, or DST-tuned per-shard budgets.

A decision carries the per-row budgets `[S, M, R]` the kernel receives as data and the static
bucket (k_max) that selects the compiled step.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class BudgetDecision:
    budgets: np.ndarray  # int32 [S, M, R]
    bucket: int
    extra: dict[str, float] = dataclasses.field(default_factory=dict)

    def scalars(self) -> dict[str, float]:
        per_shard = self.budgets.reshape(self.budgets.shape[0], -1).mean(axis=1)
        out = {f"budget/shard{s}": float(b) for s, b in enumerate(per_shard)}
        out["budget/bucket"] = float(self.bucket)
        out.update(self.extra)
        return out


class FixedBudgets:
    """The batcher's base budgets unchanged (DST off): one bucket, one compiled step."""

    def __init__(self, bucket: int):
        self.bucket = bucket

    def decide(self, step_batch: dict) -> BudgetDecision:
        return BudgetDecision(np.asarray(step_batch["budgets"], np.int32), self.bucket)

    def observe(self, decision: BudgetDecision, seconds: float) -> None:
        del decision, seconds

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        del state
