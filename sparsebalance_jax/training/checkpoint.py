"""Checkpoints with orbax: train state, the grain data-iterator state and the tuner state.

A rerun with the same work directory restores the newest checkpoint and continues with the
same data order. Saves are synchronous at step boundaries so a kill never leaves a half-written
step directory registered as complete (orbax writes to a temporary name and renames). The work
directory also records the config that writes its checkpoints (run.json), and a resume with
another config stops naming the changed fields (check_run_config).
"""

from __future__ import annotations

import json
import os

import grain
import jax
import orbax.checkpoint as ocp

from sparsebalance_jax.config import (PARAMETER_FIELDS, Config, ConfigError, config_changes,
                                      config_record)
from sparsebalance_jax.jsonfile import write_json

RUN_CONFIG = "run.json"


def make_manager(workdir: str, *, every: int, keep: int,
                 create: bool = True) -> ocp.CheckpointManager:
    """create=False: for reading only; the checkpoints folder must exist (it is not made)."""
    # Every `every` steps (and at a preemption), not also at a fresh run's first step (orbax's
    # default policy adds that save).
    policies = ocp.checkpoint_managers
    saves = policies.AnySavePolicy([policies.FixedIntervalPolicy(every),
                                    policies.PreemptionCheckpointingPolicy()])
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_decision_policy=saves,
                                           enable_async_checkpointing=False, create=create)
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


def check_run_config(workdir: str, cfg: Config, *, resuming: bool) -> list[str]:
    """Compares `cfg` with the config recorded in `workdir` when resuming from its checkpoints
    and raises ConfigError naming every changed field (config.config_changes), unless
    cfg.train.resume_with_changes. Returns the changes let through. A work directory from before
    run.json existed is resumed with a note that its config could not be compared."""
    path = os.path.join(workdir, RUN_CONFIG)
    changes: list[str] = []
    saved = _recorded_config(workdir) if resuming else None
    if resuming and saved is None:
        print(f"note: {workdir} has no {RUN_CONFIG}; the config its checkpoints were written "
              "with cannot be compared with this one", flush=True)
    elif resuming:
        changes = config_changes(saved, cfg)
        shaping = [c for c in changes if c.split(":")[0] in PARAMETER_FIELDS]
        if shaping:
            raise ConfigError(
                f"{shaping[0].split(':')[0]}: the checkpoints in {workdir} hold parameters of "
                f"another shape ({path}); changed: " + "; ".join(shaping) + ". A resume "
                "cannot change the parameters' shapes (not even with train.resume_with_changes"
                "); use another train.workdir")
        if changes and not cfg.train.resume_with_changes:
            raise ConfigError(
                f"train.resume_with_changes: the checkpoints in {workdir} were written with "
                f"another config ({path}); changed: " + "; ".join(changes) + ". Use another "
                "train.workdir, or --config.train.resume_with_changes=True to continue with "
                "the new values")
    return changes


def record_run_config(workdir: str, cfg: Config) -> None:
    """Records `cfg` as the config of `workdir`'s checkpoints (run.json), atomically; one
    process per job writes it."""
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, RUN_CONFIG), config_record(cfg), indent=1)


def check_model_matches_run(workdir: str, cfg: Config) -> None:
    """Raises ConfigError naming every model field of `cfg` that differs from the config
    recorded in `workdir` (run.json): restoring its parameters into another model fails on a
    shape or, worse, runs it as a model it was not trained as. Attention fields that differ
    are printed as a note. A work directory without run.json passes with a note."""
    saved = _recorded_config(workdir)
    if saved is None:
        print(f"note: {workdir} has no {RUN_CONFIG}; the model its checkpoints hold cannot be "
              "compared with this config's", flush=True)
        return
    # config_changes leaves out the fields that change neither the parameters nor what the
    # model computes (remat, scanned or unrolled layers: RESUMABLE_CHANGES).
    changes = config_changes(saved, cfg)
    changed = [c for c in changes if c.startswith("model.")]
    # Another attention (dense, another block size or budget) is an evaluation one may want;
    # it is said, and the evaluation's output records the attention it ran.
    other_attention = [c for c in changes if c.startswith("attention.")]
    if other_attention:
        print("note: evaluating with attention settings other than the run's: "
              + "; ".join(other_attention), flush=True)
    if changed:
        raise ConfigError(f"model: the checkpoints in {workdir} hold another model "
                          f"({os.path.join(workdir, RUN_CONFIG)}); "
                          "differs: " + "; ".join(changed) + ". Evaluate with the run's config "
                          "(its config file and the overrides it was trained with)")


def _recorded_config(workdir: str) -> dict | None:
    """The config `workdir` records (run.json), or None where it records none."""
    path = os.path.join(workdir, RUN_CONFIG)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
