"""metrics.jsonl: a resumed run appends after a cut-off line cleanly; a bad line is named."""

import pytest

from sparsebalance_jax.training.metrics import MetricsLogger, read_metrics


def test_resume_after_a_cut_off_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # killed mid-write
    logger = MetricsLogger(str(tmp_path))
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
