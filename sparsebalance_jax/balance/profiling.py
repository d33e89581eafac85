"""Profiling one decoder layer into a latency table (`LatencyTable`) on the current device.

Owns what is measured: the forward+backward time (gradients of the layer's parameters and input,
as in training) of one `DecoderLayer` of the configured model on a single row holding one
document of n tokens at budget k, for every (n, k) of a grid; and the same layer over a row of
padding only (segment id 0) at every length, whose times - a fixed part plus a part per token -
let `latency.LatencyTable` tell a call's fixed part from what a document adds (each entry holds
both: the row is the document itself, one call). Budgets are runtime data: one compile per
length, at k_max = the largest profiled budget, or the document's block count if smaller (the
kernel's bound). A budget at or beyond a document's block count attends to all of its blocks:
the same program on the same inputs, so it is timed once per length and every such budget gets
that one time (timing it again would only put noise, not a budget dependence, into the table).
Each length's step is compiled before it is timed, so `time_call`'s warm-up calls all run the
compiled code.
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
    seconds_LK, pad_seconds_L = [], []
    for n in lengths:
        k_max_n = min(k_max, n // block)
        fwd_bwd, params, x_BTE, ones_BT = _layer_step(model_cfg, attention_cfg, k_max_n, n)
        step = fwd_bwd.lower(params, x_BTE, ones_BT, jnp.ones((1,), jnp.int32)).compile()
        by_budget: dict[int, float] = {}  # the budget the kernel runs (<= k_max_n) -> seconds
        row = []
        for k in budgets:
            runs = min(k, k_max_n)
            if runs not in by_budget:
                by_budget[runs] = time_call(step, params, x_BTE, ones_BT,
                                            jnp.full((1,), runs, jnp.int32), repeats=repeats)
            row.append(by_budget[runs])
            log(f"length {n:>7} budget {k:>3}: {1e3 * row[-1]:9.3f} ms"
                + ("" if runs == k else f" (runs budget {runs}: the document's blocks)"))
        seconds_LK.append(tuple(row))
        # The same step on a row of padding only (the segment ids are data).
        pad_seconds_L.append(time_call(step, params, x_BTE, jnp.zeros_like(ones_BT),
                                       jnp.ones((1,), jnp.int32), repeats=repeats))
        log(f"length {n:>7} padding only: {1e3 * pad_seconds_L[-1]:9.3f} ms")
    table = LatencyTable(device_kind=jax.devices()[0].device_kind,
                         shape=LayerShape.from_configs(model_cfg, attention_cfg),
                         lengths=tuple(int(n) for n in lengths),
                         budgets=tuple(int(k) for k in budgets), seconds_LK=tuple(seconds_LK),
                         pad_seconds_L=tuple(pad_seconds_L))
    log(f"a call's fixed part {1e3 * table.call_seconds:.3f} ms, padding "
        f"{1e9 * table.pad_seconds_per_token:.2f} ns per token")
    return table
