"""The training loop: data -> (tuned) budgets -> jitted step -> metrics and checkpoints."""

from __future__ import annotations

import math
import os
import time

import jax
import numpy as np
from tqdm import tqdm

from sparsebalance_jax.config import Config, ConfigError, max_layer_budget
from sparsebalance_jax.data.batching import BatcherStateError
from sparsebalance_jax.data.pipeline import Lookahead
from sparsebalance_jax.model import Transformer
from sparsebalance_jax.sharding import make_mesh
from sparsebalance_jax.training import checkpoint
from sparsebalance_jax.training.metrics import MetricsLogger
from sparsebalance_jax.training.state import create_train_state, learning_rate_schedule
from sparsebalance_jax.sharding.distributed import global_batch
from sparsebalance_jax.training.step import FusedStep, ShardTimedStep


class TrainingDivergedError(FloatingPointError):
    """The loss or the gradient norm became NaN or infinite; the checkpoints written before
    are kept, the diverged state is never saved."""


def describe(cfg: Config) -> str:
    m, a, d = cfg.model, cfg.attention, cfg.data
    lines = [f"preset: {cfg.preset} on {jax.default_backend()} ({jax.device_count()} devices)"]
    if cfg.preset == "cpu":
        lines.append("no GPU found: running the small CPU preset (same architecture scaled down, "
                     "real Wikipedia text + synthetic retrieval tasks); the GPU preset trains the "
                     "0.5B-shaped model at 32K context")
    lines += [
        f"model: {m.num_layers} layers, d_model {m.d_model}, heads {m.num_heads}/{m.num_kv_heads}"
        f" x {m.head_dim}, mlp {m.mlp_dim}",
        f"attention: {a.implementation}, block {a.block_size}, base budget {a.budget}, "
        f"buckets {a.budget_buckets}",
        f"data: rows of {d.seq_len} tokens, {d.rows_per_micro_batch} rows x {d.micro_batches} "
        f"micro-batches x {cfg.num_data_shards} shards per step, batcher {d.batcher}, "
        f"lengths {d.length_distribution}",
        f"mesh: data {cfg.mesh.data} x fsdp {cfg.mesh.fsdp} x tensor {cfg.mesh.tensor}; "
        f"DST {'on' if cfg.balance.dst else 'off'}",
        f"workdir: {os.path.abspath(cfg.train.workdir)} "
        f"(checkpoints/, tensorboard/, metrics.jsonl)",
    ]
    return "\n".join(lines)


def shard_time_scalars(shard_seconds) -> dict[str, float]:
    """Measured per-shard compute (ms) and their imbalance (max / mean), when measured."""
    if shard_seconds is None:
        return {}
    out = {f"shard_ms/shard{s}": 1e3 * float(t) for s, t in enumerate(shard_seconds)}
    out["imbalance_measured"] = float(np.max(shard_seconds) / np.mean(shard_seconds))
    return out


def crop_scalars(counter) -> dict[str, float]:
    """The crop counter's totals, when the data pipeline counts its crops."""
    if counter is None:
        return {}
    return dict(cropped_docs=float(counter.count), cropped_tokens=float(counter.tokens_removed))


def _data_tokens(step_batch) -> int:
    """The step's document tokens (segment id > 0) over every process's shards."""
    local = int(np.count_nonzero(step_batch["segment_ids"]))
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return int(np.sum(multihost_utils.process_allgather(np.asarray(local, np.int64))))


def train(cfg: Config, data_iterator, balancer, *, show_progress: bool = True,
          crop_counter=None) -> dict:
    """Runs (or resumes) training to `cfg.train.num_steps`; returns the final metrics.

    `data_iterator` yields step batches in the pipeline layout ([S, M, R, T]);
    `balancer` turns each into per-row budgets and the static bucket (see
    `sparsebalance_jax.balance`), and records what it measured. `crop_counter` (the
    data.documents.CropCounter the iterator counts crops in): its totals go into every metrics
    row as cropped_docs / cropped_tokens (documents this process has read so far, prefetched
    ones included; from zero again after a resume).
    """
    mesh = make_mesh(cfg.mesh)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    state, shardings = create_train_state(cfg, mesh, model, jax.random.key(cfg.train.seed))
    # One compiled step per budget bucket, counted: budgets within a bucket are data.
    step_kind = ShardTimedStep if cfg.balance.shard_timing else FusedStep
    steps = step_kind(cfg.model, cfg.attention, mesh, shardings, cfg.attention.budget_buckets)
    manager = checkpoint.make_manager(cfg.train.workdir, every=cfg.train.checkpoint_every,
                                      keep=cfg.train.checkpoint_keep)
    start = 0
    # The next step's batch is taken while a step runs (the balancer's prefetch), and the
    # checkpoints record the iterator as if it were not.
    data_iterator = Lookahead(data_iterator)
    try:
        # Before the restore: a checkpoint of another config may not even restore into it.
        changes = checkpoint.check_run_config(cfg.train.workdir, cfg,
                                              resuming=manager.latest_step() is not None)
        restored = checkpoint.restore_latest(manager, state, data_iterator)
    except BatcherStateError as e:
        manager.close()
        raise ConfigError(f"train.resume_with_changes: {e}") from None
    except BaseException:
        manager.close()  # a refused resume leaves no manager open for a caller that goes on
        raise
    if restored is not None:
        start, state, tuner_state = restored
        balancer.set_state(tuner_state)
        print(f"resumed from step {start}" + "".join(f"\n  changed {c}" for c in changes))
        if start >= cfg.train.num_steps:
            print(f"nothing to train: the newest checkpoint is at step {start}, "
                  f"train.num_steps is {cfg.train.num_steps}", flush=True)
    # Only once restored: a run.json naming a config that could not resume would refuse the
    # config that wrote the checkpoints.
    if jax.process_index() == 0:
        checkpoint.record_run_config(cfg.train.workdir, cfg)
    logger = MetricsLogger(cfg.train.workdir, enabled=jax.process_index() == 0, start=start)
    schedule = learning_rate_schedule(cfg.optimizer, cfg.train.num_steps)
    row_tokens = cfg.num_data_shards * cfg.data.micro_batches * cfg.data.rows_per_micro_batch * \
        cfg.data.seq_len
    bar = tqdm(total=cfg.train.num_steps, initial=start, disable=not show_progress,
               dynamic_ncols=True)
    last = {}
    try:
        for step in range(start, cfg.train.num_steps):
            step_batch = next(data_iterator)
            decision = balancer.decide(step_batch, state.params)
            largest = max_layer_budget(int(decision.budgets.max()),
                                       cfg.attention.layer_budget_scale)
            if decision.budgets.min() < 1 or largest > decision.bucket:
                raise ValueError(f"step {step + 1}: budgets {np.unique(decision.budgets)} "
                                 f"(largest per-layer budget {largest}) outside "
                                 f"[1, bucket {decision.bucket}]")
            data_tokens = _data_tokens(step_batch)
            step_batch = dict(step_batch, budgets=decision.budgets)
            batch = global_batch(steps.batch_shardings, steps.layout(step_batch))
            # A new bucket, and each process's first step, compiles here, outside the timing.
            compile_seconds = steps.prepare(decision.bucket, state, batch)
            t0 = time.perf_counter()
            state, metrics, shard_seconds = steps(decision.bucket, state, batch)
            if step + 1 < cfg.train.num_steps:
                # While the step runs: what the balancer needs of the next batch, if anything
                # (DST's coverage probe, with the parameters this step is computing).
                balancer.prefetch(data_iterator.peek, state.params)
            loss = float(metrics["loss"])  # Blocks: the step's time is measured to here.
            seconds = time.perf_counter() - t0
            grad_norm = float(metrics["grad_norm"])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                newest = manager.latest_step()
                kept = (f"Checkpoints up to step {newest} are kept in {cfg.train.workdir}"
                        if newest is not None else
                        f"No checkpoint was written to {cfg.train.workdir} yet")
                if math.isfinite(loss):
                    # A finite loss over non-finite gradients (the backward pass alone broke):
                    # the state the step returns is not finite; it is never saved.
                    raise TrainingDivergedError(
                        f"gradient norm is {grad_norm} at step {step + 1} (loss {loss}); "
                        f"stopping before its update is saved. {kept}")
                # The loss is of the parameters the step began with: those of the newest
                # checkpoint, when it is the step before. They are finite, not known good.
                raise TrainingDivergedError(
                    f"loss is {loss} at step {step + 1}; stopping. {kept}; this loss is that "
                    f"of the parameters step {step + 1} began with, so "
                    + ("resume from an earlier checkpoint (or with a lower learning rate)"
                       if newest is not None else "start afresh with a lower learning rate"))
            balancer.observe(decision, shard_seconds)
            last = dict(loss=loss, grad_norm=grad_norm,
                        learning_rate=float(schedule(step)), step_time_s=seconds,
                        tokens_per_s=data_tokens / seconds, row_tokens_per_s=row_tokens / seconds,
                        trained_tokens=float(metrics["tokens"]),
                        compiles=steps.compiles, compile_s=compile_seconds,
                        **decision.scalars(),
                        **shard_time_scalars(shard_seconds), **crop_scalars(crop_counter))
            logger.write(step + 1, last, tensorboard=(step + 1) % cfg.train.log_every == 0)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{last['tokens_per_s']:.0f}")
            bar.update(1)
            checkpoint.save(manager, step + 1, state, data_iterator, balancer.get_state(),
                            force=step + 1 == cfg.train.num_steps)
    finally:
        bar.close()
        manager.wait_until_finished()
        manager.close()
        logger.close()
    return last
