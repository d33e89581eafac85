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
        path = os.path.join(workdir, "metrics.jsonl")
        _drop_partial_line(path)
        self._jsonl = open(path, "a", buffering=1)

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


def _drop_partial_line(path: str) -> None:
    """A log cut off mid-line (a kill or a full disk during a write) loses that last, partial
    line before a resumed run appends: otherwise the next record would be glued onto it."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_metrics(workdir: str) -> dict[int, dict]:
    """Step -> metrics; a step logged twice (rerun after a kill) keeps its last record. A line
    that is not a JSON record with a step fails naming the file and line."""
    out = {}
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
                out[rec["step"]] = rec
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: not a metrics record ({e}): "
                                 f"{line[:80]!r}") from None
    return out
