"""metrics.jsonl: a resumed run appends after a cut-off line cleanly and keeps one record per
step; a bad line is named."""

import pytest

from sparsebalance_jax.training.metrics import MetricsLogger, read_metrics


def test_resume_after_a_cut_off_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # killed mid-write
    logger = MetricsLogger(str(tmp_path), start=1)
    logger.write(2, {"loss": 1.5}, tensorboard=False)
    logger.write(3, {"loss": 1.25}, tensorboard=False)
    logger.close()
    assert read_metrics(str(tmp_path)) == {1: {"step": 1, "loss": 2.0},
                                           2: {"step": 2, "loss": 1.5},
                                           3: {"step": 3, "loss": 1.25}}


def test_a_bad_line_is_named(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"loss": 1.0}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a metrics record"):
        read_metrics(str(tmp_path))


def test_resume_drops_the_records_after_its_checkpoint(tmp_path):
    # Logged to step 5, killed, resumed from the checkpoint at step 3: steps 4 and 5 are
    # written again by the resumed run, once each in the file.
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {s}, "loss": {s}.0}}\n' for s in range(1, 6)))
    logger = MetricsLogger(str(tmp_path), start=3)
    for step in (4, 5, 6):
        logger.write(step, {"loss": step + 0.5}, tensorboard=True)
    logger.close()
    steps = [line.split(",")[0] for line in path.read_text().splitlines()]
    assert steps == [f'{{"step": {s}' for s in range(1, 7)]
    assert read_metrics(str(tmp_path))[4]["loss"] == 4.5
