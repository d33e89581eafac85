"""Run metrics: TensorBoard scalars plus a line-per-step JSON log (`metrics.jsonl`)."""

from __future__ import annotations

import json
import os

from tensorboardX import SummaryWriter

from sparsebalance_jax.jsonfile import write_text


class MetricsLogger:
    """Writes from one process only (`enabled`): a multi-process job logs on process 0.

    `start`: the step a run resumes from (0: a fresh run). The records of later steps, written
    by a run stopped before and about to be written again, are dropped from metrics.jsonl and
    hidden from TensorBoard (its purge_step), so each step keeps one record: this run's."""

    def __init__(self, workdir: str, *, enabled: bool = True, start: int = 0):
        self._enabled = enabled
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._writer = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=start + 1)
        path = os.path.join(workdir, "metrics.jsonl")
        _keep_records_through(path, start)
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


def _keep_records_through(path: str, start: int) -> None:
    """Rewrites the log (whole or not at all) without a line cut off at its end (a kill or a
    full disk mid-write: the next record would be glued onto it) and without the records of
    steps after `start`; other lines that are not records stay, for read_metrics to name."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()

    def kept(line: str) -> bool:
        if not line.endswith("\n"):
            return False
        try:
            return json.loads(line)["step"] <= start
        except (ValueError, KeyError, TypeError):
            return True

    keep = [line for line in lines if kept(line)]
    if len(keep) < len(lines):
        write_text(path, "".join(keep))


def read_metrics(workdir: str) -> dict[int, dict]:
    """Step -> metrics; a step logged twice keeps its last record (a resumed run drops the
    records after its checkpoint, but a log may come from elsewhere). A line
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
