"""Profiling one decoder layer into a latency table (`LatencyTable`) on the current device.

Owns what is measured: the forward+backward time (gradients of the layer's parameters and
input, as in training) of one `DecoderLayer` of the configured model on a single row holding
one document of n tokens at budget k, for every (n, k) of a grid; and the padding cost, the
same layer over a row of padding only (segment id 0), divided by its length. The row is the
document itself (no padding), so the table entry is exactly `doc_seconds(n, k)` of
`latency.LatencyModel`. Budgets are runtime data: one compile per length, at k_max = the
largest profiled budget, or the document's block count if smaller (the kernel's bound; a budget
beyond a document's blocks attends to all of them, the same work).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from sparsebalance_jax.balance.latency import LatencyTable, LayerShape
from sparsebalance_jax.balance.timing import time_call
from sparsebalance_jax.config import AttentionConfig, ModelConfig
from sparsebalance_jax.model.transformer import DecoderLayer


def _layer_step(model_cfg: ModelConfig, attention_cfg: AttentionConfig, k_max: int, n: int):
    """A jitted fwd+bwd of one layer on a [1, n] row, and its (params, x) arguments."""
    layer = DecoderLayer(model_cfg, attention_cfg, k_max)
    x_BTE = jax.random.normal(jax.random.key(0), (1, n, model_cfg.d_model), jnp.float32)
    positions_BT = jnp.arange(n, dtype=jnp.int32)[None]
    ones_BT = jnp.ones((1, n), jnp.int32)
    scale = jnp.float32(1.0)
    params = layer.init(jax.random.key(1), x_BTE, ones_BT, positions_BT,
                        jnp.ones((1,), jnp.int32), scale)

    @jax.jit
    def fwd_bwd(params, x_BTE, segment_ids_BT, budget_B):
        def loss(params, x_BTE):
            y_BTE, _ = layer.apply(params, x_BTE, segment_ids_BT, positions_BT, budget_B, scale)
            return jnp.sum(y_BTE.astype(jnp.float32) ** 2)
        return jax.grad(loss, argnums=(0, 1))(params, x_BTE)

    return fwd_bwd, params, x_BTE, ones_BT


def profile_layer(model_cfg: ModelConfig, attention_cfg: AttentionConfig,
                  lengths: Sequence[int], budgets: Sequence[int], *, repeats: int = 5,
                  log=print) -> LatencyTable:
    """Measure the table on `jax.devices()[0]`; lengths must be multiples of the block size."""
    block = attention_cfg.block_size
    bad = [n for n in lengths if n % block]
    if bad:
        raise ValueError(f"profile lengths {bad} are not multiples of attention.block_size="
                         f"{block}")
    if list(lengths) != sorted(set(lengths)):
        raise ValueError(f"profile lengths {list(lengths)} must be strictly increasing")
    k_max = max(budgets)
    seconds_LK = []
    for n in lengths:
        k_max_n = min(k_max, n // block)
        fwd_bwd, params, x_BTE, ones_BT = _layer_step(model_cfg, attention_cfg, k_max_n, n)
        row = []
        for k in budgets:
            budget_B = jnp.full((1,), min(k, k_max_n), jnp.int32)
            row.append(time_call(fwd_bwd, params, x_BTE, ones_BT, budget_B, repeats=repeats))
            log(f"length {n:>7} budget {k:>3}: {1e3 * row[-1]:9.3f} ms")
        seconds_LK.append(tuple(row))
    # The last (longest) length's step is reused: same shape, only the segment ids differ.
    n = lengths[-1]
    pad_seconds = time_call(fwd_bwd, params, x_BTE, jnp.zeros_like(ones_BT),
                            jnp.ones((1,), jnp.int32), repeats=repeats)
    log(f"padding row of {n}: {1e3 * pad_seconds:9.3f} ms")
    return LatencyTable(device_kind=jax.devices()[0].device_kind,
                        shape=LayerShape.from_configs(model_cfg, attention_cfg),
                        lengths=tuple(int(n) for n in lengths),
                        budgets=tuple(int(k) for k in budgets), seconds_LK=tuple(seconds_LK),
                        pad_seconds_per_token=pad_seconds / n)
