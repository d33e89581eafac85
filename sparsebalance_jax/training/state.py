"""Train state created already sharded: abstract shapes, then shardings, then a jitted init."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState
from jax.sharding import Mesh

from sparsebalance_jax.config import Config, OptimizerConfig
from sparsebalance_jax.model import Transformer
from sparsebalance_jax.sharding import LOGICAL_RULES
from sparsebalance_jax.training.step import mesh_context


def learning_rate_schedule(opt: OptimizerConfig, num_steps: int) -> optax.Schedule:
    """Linear warm-up to the peak, then cosine decay to `min_lr_ratio` x peak at the last
    update (a run shorter than its warm-up ends on the rising ramp). Update n (counting from 0)
    takes the rate at n + 1, so that the first update moves the weights (peak / warmup_steps,
    not 0) and the peak is reached at update warmup_steps - 1. Without a warm-up the first
    update takes the peak and the cosine spans the updates."""
    if opt.warmup_steps == 0:
        return optax.cosine_decay_schedule(init_value=opt.learning_rate,
                                           decay_steps=max(num_steps - 1, 1),
                                           alpha=opt.min_lr_ratio)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=opt.learning_rate, warmup_steps=opt.warmup_steps,
        decay_steps=max(num_steps, opt.warmup_steps + 1),
        end_value=opt.learning_rate * opt.min_lr_ratio)
    return lambda count: schedule(count + 1)


def make_optimizer(opt: OptimizerConfig, num_steps: int) -> optax.GradientTransformation:
    def decay_mask(params):
        # No weight decay on norm scales and biases (vectors per layer).
        return jax.tree_util.tree_map_with_path(
            lambda path, _: not any(getattr(k, "key", None) in ("scale", "bias") for k in path),
            params)

    return optax.chain(
        optax.clip_by_global_norm(opt.grad_clip_norm),
        optax.adamw(learning_rate_schedule(opt, num_steps), b1=opt.b1, b2=opt.b2, eps=opt.eps,
                    weight_decay=opt.weight_decay, mask=decay_mask))


def dummy_inputs(batch: int, seq_len: int):
    tokens_BT = jnp.zeros((batch, seq_len), jnp.int32)
    positions_BT = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len))
    segment_ids_BT = jnp.ones((batch, seq_len), jnp.int32)
    return tokens_BT, segment_ids_BT, positions_BT, jnp.ones((batch,), jnp.int32)


def create_train_state(cfg: Config, mesh: Mesh, model: Transformer, rng: jax.Array):
    """Returns (state, state_shardings): parameters and optimizer state born sharded."""
    tx = make_optimizer(cfg.optimizer, cfg.train.num_steps)
    # One row per data shard, just long enough for the largest budget bucket: a cheap init.
    init_len = min(cfg.data.seq_len, cfg.attention.budget_buckets[-1] * cfg.attention.block_size)
    inputs = dummy_inputs(cfg.num_data_shards, init_len)

    def init(rng):
        variables = model.init(rng, *inputs)
        return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)

    with mesh_context(mesh):
        abstract = jax.eval_shape(init, rng)
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh,
                                                LOGICAL_RULES)
        state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)
    return state, shardings
