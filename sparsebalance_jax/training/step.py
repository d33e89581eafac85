"""The pure train step: gradient accumulation over micro-batches, token-weighted loss.

A step batch holds `[M, B, T]` arrays (micro-batches, global rows, tokens) and per-row budgets
`[M, B]`; rows are split over data x fsdp, so shard s owns rows [s*R, (s+1)*R). The loss is the
mean over every trained token of the whole step, so any mesh gives the same loss and gradients.
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sparsebalance_jax.model import Transformer, token_losses
from sparsebalance_jax.sharding import BATCH_AXES, LOGICAL_RULES

BATCH_KEYS = ("inputs", "targets", "loss_mask", "segment_ids", "positions", "budgets")


def loss_and_grads(model: Transformer, params, batch):
    """Summed loss, trained-token count and summed gradients over the micro-batches."""

    def micro(carry, mb):
        grads_acc, loss_acc, count_acc = carry

        def loss_fn(p):
            logits_BTV = model.apply({"params": p}, mb["inputs"], mb["segment_ids"],
                                     mb["positions"], mb["budgets"])
            return token_losses(logits_BTV, mb["targets"], mb["loss_mask"])

        (loss_sum, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
        return (grads_acc, loss_acc + loss_sum, count_acc + count), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, loss_sum, count), _ = jax.lax.scan(
        micro, (zeros, jnp.float32(0), jnp.float32(0)), {k: batch[k] for k in BATCH_KEYS})
    return loss_sum, count, grads


def train_step(state, batch, *, model: Transformer):
    loss_sum, count, grads = loss_and_grads(model, state.params, batch)
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    new_state = state.apply_gradients(grads=grads)
    metrics = dict(loss=loss_sum / denom, tokens=count, grad_norm=optax.tree.norm(grads))
    return new_state, metrics


def batch_shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    rows = NamedSharding(mesh, P(None, BATCH_AXES, None))
    return {k: (NamedSharding(mesh, P(None, BATCH_AXES)) if k == "budgets" else rows)
            for k in BATCH_KEYS}


def mesh_context(mesh: Mesh):
    """The context a step is traced in: the mesh and the logical axis rules."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(LOGICAL_RULES))
    return stack


def jit_train_step(model_cfg, attention_cfg, state_shardings):
    """The jitted step with the state donated; `k_max`, the budget bucket, is its one static
    argument (one compiled program per bucket). Inputs arrive placed: the state as
    `create_train_state` made it, the batch with `batch_shardings(mesh)` (jax.jit takes no
    in_shardings with a keyword argument); outputs keep the state's shardings."""

    def step(state, batch, *, k_max: int):
        return train_step(state, batch, model=Transformer(model_cfg, attention_cfg, k_max))

    return jax.jit(step, out_shardings=(state_shardings, None), donate_argnames="state",
                   static_argnames="k_max")


def compile_train_step(model: Transformer, mesh: Mesh, state_shardings):
    """`run(state, batch)` for one fixed model (its k_max), traced under the mesh."""
    jitted = jit_train_step(model.model, model.attention, state_shardings)

    def run(state, batch):
        with mesh_context(mesh):
            return jitted(state, batch, k_max=model.k_max)

    return run


def to_step_layout(step_batch: dict) -> dict:
    """Pipeline layout [S, M, R, T] (budgets [S, M, R]) -> step layout [M, S*R, T] ([M, S*R])."""
    out = {}
    for key in BATCH_KEYS:
        x = step_batch[key]
        x = x.swapaxes(0, 1)  # [M, S, R, ...]
        out[key] = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
    return out
