"""Attention implementations behind one call: dense reference, cuDNN, and MoBA (Pallas).

All take q `[B, T, Hq, D]`, k/v `[B, T, Hkv, D]`, packed-document segment ids `[B, T]` (0 marks
padding) and per-row MoBA budgets `[B]`. Dense implementations ignore the budget. Under a mesh
the call runs inside `shard_map`: every device holds its batch rows (split over data x fsdp)
and its heads (split over tensor), so each data shard runs its own budgets in one program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from sparsebalance_jax.config import AttentionConfig
from sparsebalance_jax.sharding.mesh import rules_without


def dense_reference(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT):
    """Exact causal attention within documents, softmax in float32 (any backend)."""
    b, t, hq, d = q_BTHD.shape
    hkv = k_BTKD.shape[2]
    q_BTKGD = q_BTHD.reshape(b, t, hkv, hq // hkv, d)
    scores_BKGQS = jnp.einsum("bqkgd,bskd->bkgqs", q_BTKGD, k_BTKD,
                              preferred_element_type=jnp.float32) / jnp.sqrt(d).astype(jnp.float32)
    causal_QS = jnp.tril(jnp.ones((t, t), bool))
    same_doc_BQS = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    valid_B11QS = (causal_QS[None] & same_doc_BQS & (segment_ids_BT[:, :, None] > 0))[:, None, None]
    scores_BKGQS = jnp.where(valid_B11QS, scores_BKGQS, -jnp.inf)
    # A padding query has no valid key; give it zeros instead of NaN.
    probs_BKGQS = jax.nn.softmax(jnp.where(valid_B11QS.any(-1, keepdims=True), scores_BKGQS, 0.0))
    probs_BKGQS = jnp.where(valid_B11QS, probs_BKGQS, 0.0)
    out_BTKGD = jnp.einsum("bkgqs,bskd->bqkgd", probs_BKGQS.astype(v_BTKD.dtype), v_BTKD,
                           preferred_element_type=jnp.float32)
    return out_BTKGD.reshape(b, t, hq, d).astype(q_BTHD.dtype)


def _cudnn(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT):
    # jax.nn.dot_product_attention takes no segment ids: documents are kept apart by an explicit
    # [B, 1, T, T] mask, which costs O(T^2) memory. To it padding (segment 0) is one more
    # segment: a padding row attends to every earlier padding position, and its output never
    # reaches a real token or the loss.
    same_doc_BQS = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    return jax.nn.dot_product_attention(q_BTHD, k_BTKD, v_BTKD, mask=same_doc_BQS[:, None],
                                        is_causal=True, implementation="cudnn")


def _moba(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *, cfg: AttentionConfig, k_max: int):
    from pallas_kernels.moba import moba_attention  # The kernel package is only needed here.

    return moba_attention(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B,
                          block_size=cfg.block_size, k_max=k_max,
                          backend=cfg.moba_backend, interpret=cfg.interpret)


def _local_attention(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *, cfg, k_max):
    if cfg.implementation == "reference":
        return dense_reference(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT)
    if cfg.implementation == "cudnn":
        return _cudnn(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT)
    if cfg.implementation == "moba":
        return _moba(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, cfg=cfg, k_max=k_max)
    raise ValueError(f"attention.implementation: unknown {cfg.implementation!r}")


# The name attention_op(keep_residuals=True) gives its output and its backward pass's residuals;
# a rematerialised layer whose policy saves it keeps them instead of recomputing them.
KEPT_RESIDUALS = "attention_residuals"


def _keeping_residuals(fn):
    """fn, with its output and the residuals its backward pass reads named KEPT_RESIDUALS. Under
    a layer rematerialised with a policy that saves them the backward pass reads them, and fn's
    forward (MoBA: the gate, its layout, the forward kernel and the slots' merge) runs once per
    step, not twice: its recomputed results go unused, and XLA drops the work behind them (the
    Pallas kernels' custom calls have no side effects). The layer's other intermediates are
    recomputed as before."""
    @jax.custom_vjp
    def kept(*args):
        return fn(*args)

    def fwd(*args):
        # The output too: the layer's backward pass reads it (the output projection's input).
        out, vjp_fn = jax.tree.map(lambda x: checkpoint_name(x, KEPT_RESIDUALS),
                                   jax.vjp(fn, *args))
        return out, vjp_fn

    kept.defvjp(fwd, lambda vjp_fn, g: vjp_fn(g))
    return kept


def attention_op(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *,
                 cfg: AttentionConfig, k_max: int, keep_residuals: bool = False):
    """Dispatch on `cfg.implementation`; under a context mesh, per device via shard_map.
    keep_residuals: under MoBA, name its output and the backward pass's residuals KEPT_RESIDUALS
    (_keeping_residuals). The dense implementations take no such names (the backward of
    jax.nn.dot_product_attention reads the O(T^2) document mask built here, cheaper to build again
    than to hold per layer): a layer recomputes them."""
    local = functools.partial(_local_attention, cfg=cfg, k_max=k_max)
    if keep_residuals and cfg.implementation == "moba":
        local = _keeping_residuals(local)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or set(mesh.manual_axes) == set(mesh.axis_names):
        # No mesh, or already inside a shard_map over every axis (the per-shard timed step):
        # the arrays here are this device's own.
        return local(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B)
    # Per device over the axes not yet manual (all, or all but `data` in the data-parallel
    # step): the activations' own rules, less the manual axes.
    manual = set(mesh.manual_axes)
    rules = dict(rules_without(manual))
    batch = rules["act_batch"]
    heads, kv_heads = (P(batch, None, rules[name], None) for name in ("act_heads", "act_kv_heads"))
    rows = P(batch, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(heads, kv_heads, kv_heads, rows, P(batch)),
                         out_specs=heads, axis_names=set(mesh.axis_names) - manual,
                         check_vma=False)(
        q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B)
