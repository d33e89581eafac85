"""The training loop: a step whose gradients are not finite is never checkpointed; a resumed run
continues as an uninterrupted one."""

import json
import math
import os

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.longbench import get_config
from sparsebalance_jax.config import ConfigError
from sparsebalance_jax.data.pipeline import Lookahead
from sparsebalance_jax.training import checkpoint, launch, loop


def _short_run(workdir, *, num_steps=3, checkpoint_every=2):
    """The CPU preset cut to a one-layer model on 256-token rows of text, dense reference
    attention, no DST, on this process's eight host devices."""
    raw = get_config("cpu")
    raw.mesh.data = -1
    raw.attention.update(implementation="reference", block_size=32)
    raw.balance.dst = False
    raw.data.update(seq_len=256, max_doc_len=256, min_doc_len=32, length_scale=0.01,
                    synthetic_weight=0.0)
    raw.model.update(num_layers=1, d_model=64, mlp_dim=128)
    raw.train.update(num_steps=num_steps, checkpoint_every=checkpoint_every,
                     workdir=str(workdir))
    raw.optimizer.warmup_steps = 1
    return raw


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
    raw = _short_run(tmp_path / "run", num_steps=4, checkpoint_every=1)
    with pytest.raises(loop.TrainingDivergedError,
                       match=r"gradient norm is nan at step 2 \(loss [0-9.]+\); stopping before "
                             r"its update is saved\. Checkpoints up to step 1 are kept"):
        launch.run(raw)
    assert len(calls) == 2 and math.isfinite(calls[1])
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["1"]


class _Killed(Exception):
    """Stands for a kill between a step's metrics line and its checkpoint."""


def test_resume_restores_the_state_and_data_and_rewrites_the_later_metrics(tmp_path,
                                                                           monkeypatch):
    """Killed after step 3's metrics line, before its checkpoint: the rerun resumes from step
    2's checkpoint (parameters, optimizer and data iterator), trains step 3 as an uninterrupted
    run does, and metrics.jsonl holds one line per step. The uninterrupted run checkpoints its
    last step (3) as well as step 2 (checkpoint_every=2)."""
    launch.run(_short_run(tmp_path / "straight"))
    # Every checkpoint_every steps, and the last step whatever the cadence.
    assert sorted(os.listdir(tmp_path / "straight" / "checkpoints")) == ["2", "3"]
    save = loop.checkpoint.save

    def killed_at_3(manager, step, *args, **kwargs):
        if step == 3:
            raise _Killed
        return save(manager, step, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(loop.checkpoint, "save", killed_at_3)
        with pytest.raises(_Killed):
            launch.run(_short_run(tmp_path / "killed"))
    launch.run(_short_run(tmp_path / "killed"))

    def lines(run):
        with open(tmp_path / run / "metrics.jsonl") as f:
            return [json.loads(line) for line in f]

    straight, resumed = lines("straight"), lines("killed")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    # Each process compiles before its first step, outside the step's time: the straight run
    # at step 1, the resumed one at step 3.
    for run, first in ((straight, 1), (resumed[2:], 3)):
        for r in run:
            if r["step"] == first:
                assert r["compile_s"] > r["step_time_s"], r
            else:
                assert r["compile_s"] == 0.0, r
    for want, got in zip(straight, resumed):
        assert got["loss"] == want["loss"] and got["grad_norm"] == want["grad_norm"], got["step"]
        assert got["trained_tokens"] == want["trained_tokens"], got["step"]
    # A resume refused (here: another model width) closes the checkpoint manager it opened.
    closed = []
    make_manager = loop.checkpoint.make_manager

    def recorded(*args, **kwargs):
        manager = make_manager(*args, **kwargs)
        close = manager.close
        manager.close = lambda: (closed.append(True), close())[1]
        return manager

    changed = _short_run(tmp_path / "straight", num_steps=4)
    changed.model.d_model = 32
    with monkeypatch.context() as m:
        m.setattr(loop.checkpoint, "make_manager", recorded)
        with pytest.raises(ConfigError, match="model.d_model"):
            launch.run(changed)
    assert closed == [True]


def test_checkpoint_round_trips_state_data_position_and_tuner_state(tmp_path):
    """checkpoint.save / restore_latest: the newest step's train state, the data iterator's
    position (a batch peeked at and not taken comes again) and the DST tuner's state as saved."""
    rng = np.random.default_rng()
    make = lambda: Lookahead(iter(grain.MapDataset.range(100).to_iter_dataset()))
    manager = checkpoint.make_manager(str(tmp_path), every=1, keep=2)
    it = make()
    states, tuners = {}, {}
    for step in (1, 2):
        states[step] = {"w": jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)}
        tuners[step] = {"step": int(rng.integers(1, 99)),
                        "history_budgets_HS": rng.integers(1, 9, (3, 4)).tolist(),
                        "ema": {"ratio_S": rng.random(4).tolist()}}
        taken = [next(it) for _ in range(int(rng.integers(1, 5)))]
        assert it.peek() == taken[-1] + 1
        checkpoint.save(manager, step, states[step], it, tuners[step])
    manager.wait_until_finished()
    resumed = make()
    step, state, tuner = checkpoint.restore_latest(manager, states[2], resumed)
    assert step == 2 and tuner == tuners[2]
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(states[2]["w"]))
    assert next(resumed) == taken[-1] + 1
    manager.close()
