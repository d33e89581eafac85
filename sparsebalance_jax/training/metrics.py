"""Run metrics: TensorBoard scalars plus a line-per-step JSON log (`metrics.jsonl`)."""

from __future__ import annotations

import json
import os

from tensorboardX import SummaryWriter


class MetricsLogger:
    """Writes from one process only (`enabled`): a multi-process job logs on process 0."""

    def __init__(self, workdir: str, *, enabled: bool = True):
        self._enabled = enabled
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._writer = SummaryWriter(os.path.join(workdir, "tensorboard"))
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)

    def write(self, step: int, scalars: dict[str, float], *, tensorboard: bool = True) -> None:
        if not self._enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        if tensorboard:
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if not self._enabled:
            return
        self._writer.flush()
        self._writer.close()
        self._jsonl.close()


def read_metrics(workdir: str) -> dict[int, dict]:
    """Step -> metrics; a step logged twice (rerun after a kill) keeps its last record."""
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            out[rec["step"]] = rec
    return out
