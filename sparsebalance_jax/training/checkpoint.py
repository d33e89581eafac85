"""Checkpoints with orbax: train state, the grain data-iterator state and the tuner state.

A rerun with the same work directory restores the newest checkpoint and continues with the
same data order. Saves are synchronous at step boundaries so a kill never leaves a half-written
step directory registered as complete (orbax writes to a temporary name and renames).
"""

from __future__ import annotations

import os

import grain
import jax
import orbax.checkpoint as ocp


def make_manager(workdir: str, *, every: int, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")), options=options,
        item_names=("state", "data", "tuner"),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": grain.checkpoint.CheckpointHandler(),
                       "tuner": ocp.JsonCheckpointHandler()})


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator, tuner_state: dict,
         *, force: bool = False) -> bool:
    return manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator),
        tuner=ocp.args.JsonSave(tuner_state)), force=force)


def restore_latest(manager: ocp.CheckpointManager, abstract_state, data_iterator):
    """Restores in place into `data_iterator`; returns (step, state, tuner_state) or None."""
    step = manager.latest_step()
    if step is None:
        return None
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target),
        data=grain.checkpoint.CheckpointRestore(data_iterator),
        tuner=ocp.args.JsonRestore()))
    return step, restored["state"], restored["tuner"]
