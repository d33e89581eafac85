"""The training loop's stops: a step whose gradients are not finite is never checkpointed."""

import math
import os

import jax
import pytest

from configs.longbench import get_config
from sparsebalance_jax.training import launch, loop


def test_non_finite_gradients_stop_before_their_update_is_saved(tmp_path, monkeypatch):
    """A finite loss over non-finite gradients (the backward pass alone broke) leaves the
    step's returned state non-finite: the loop stops at that step and saves nothing of it, so
    a rerun resumes from the last finite checkpoint, not into NaN parameters."""
    calls = []

    class BrokenSecondBackward(loop.FusedStep):
        def __call__(self, bucket, state, batch):
            state, metrics, shard_seconds = super().__call__(bucket, state, batch)
            calls.append(float(metrics["loss"]))
            if len(calls) == 2:
                state = state.replace(params=jax.tree.map(lambda p: p * math.nan, state.params))
                metrics = dict(metrics, grad_norm=math.nan)
            return state, metrics, shard_seconds

    monkeypatch.setattr(loop, "FusedStep", BrokenSecondBackward)
    raw = get_config("cpu")
    raw.mesh.data = -1  # this process's eight host devices
    raw.attention.update(implementation="reference", block_size=32)
    raw.balance.dst = False
    raw.data.update(seq_len=256, max_doc_len=256, min_doc_len=32, length_scale=0.01,
                    synthetic_weight=0.0)
    raw.model.update(num_layers=1, d_model=64, mlp_dim=128)
    raw.train.update(num_steps=4, checkpoint_every=1, workdir=str(tmp_path / "run"))
    raw.optimizer.warmup_steps = 1
    with pytest.raises(loop.TrainingDivergedError,
                       match=r"gradient norm is nan at step 2 \(loss [0-9.]+\); stopping before "
                             r"its update is saved\. Checkpoints up to step 1 are kept"):
        launch.run(raw)
    assert len(calls) == 2 and math.isfinite(calls[1])
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["1"]
