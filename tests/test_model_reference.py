"""The decoder against an independent float64 NumPy forward pass of the same parameters: pre-norm
layers (RMSNorm, Qwen2-style biased q/k/v, rotary positions, grouped-query attention within
documents, SwiGLU), final norm, LM head. The other model tests check properties (causality,
documents kept apart, learning) that a misplaced norm or residual, or a wrong rotation, pass."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sparsebalance_jax.model import Transformer
from tests.test_model import packed_inputs, tiny_config


def _rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _rope(x_BTHD, pos_BT, theta):
    """Rotate-half RoPE as a complex product: (x1 + i x2) e^{i pos f}, f = theta^(-2j/d)."""
    d = x_BTHD.shape[-1]
    freq = theta ** (-np.arange(0, d, 2) / d)
    z = (x_BTHD[..., :d // 2] + 1j * x_BTHD[..., d // 2:]) \
        * np.exp(1j * pos_BT[..., None, None] * freq)
    return np.concatenate([z.real, z.imag], axis=-1)


def _reference_logits(p, cfg, ids_BT, seg_BT, pos_BT):
    m = cfg.model
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), p)
    x = p["embed"]["embedding"][ids_BT]
    t = ids_BT.shape[1]
    group = m.num_heads // m.num_kv_heads
    valid_BQS = (np.tril(np.ones((t, t), bool))[None] & (seg_BT[:, :, None] == seg_BT[:, None, :])
                 & (seg_BT[:, :, None] > 0))
    for i in range(m.num_layers):
        lp = jax.tree.map(lambda a: a[i], p["layers"])
        a = lp["attn"]
        h = _rms_norm(x, lp["attn_norm"]["scale"], m.rms_eps)
        q = _rope(np.einsum("bte,ehd->bthd", h, a["q"]["kernel"]) + a["q"]["bias"], pos_BT,
                  m.rope_theta)
        k = _rope(np.einsum("bte,ehd->bthd", h, a["k"]["kernel"]) + a["k"]["bias"], pos_BT,
                  m.rope_theta)
        v = np.einsum("bte,ehd->bthd", h, a["v"]["kernel"]) + a["v"]["bias"]
        k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # query head -> kv head
        s = np.einsum("bqhd,bshd->bhqs", q, k) / np.sqrt(m.head_dim)
        # Masked keys weigh 0; a padding query (no valid key) gets zeros, not NaN.
        top = np.where(valid_BQS[:, None], s, -np.inf).max(-1, keepdims=True)
        s = np.exp(s - np.where(np.isfinite(top), top, 0)) * valid_BQS[:, None]
        probs = s / np.maximum(s.sum(-1, keepdims=True), 1e-300)
        out = np.einsum("bhqs,bshd->bqhd", probs, v)
        x = x + np.einsum("bthd,hde->bte", out, a["o"]["kernel"])
        h = _rms_norm(x, lp["mlp_norm"]["scale"], m.rms_eps)
        mlp = lp["mlp"]
        gate = h @ mlp["gate"]["kernel"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ mlp["up"]["kernel"])) @ mlp["down"]["kernel"]
    x = _rms_norm(x, p["final_norm"]["scale"], m.rms_eps)
    return x @ p["lm_head"]["kernel"]


def _perturbed_params(model, rng, *inputs):
    """Initial parameters moved by noise: norm scales off 1, biases off 0."""
    params = nn.meta.unbox(model.init(jax.random.key(0), *inputs)["params"])
    return jax.tree.map(lambda x: x + jnp.asarray(0.3 * rng.standard_normal(x.shape),
                                                  x.dtype), params)


def test_logits_match_a_numpy_reference_forward():
    """Rows of two and three documents, the second row padded at its end; logits compared at
    every document token (a padding query's output is never used)."""
    rng = np.random.default_rng()
    for scan_layers in (True, False):
        cfg = tiny_config(scan_layers=scan_layers)
        model = Transformer(cfg.model, cfg.attention, cfg.k_max)
        ids, seg, pos = packed_inputs(rng, 2, 64, [0, 27])
        _, seg1, pos1 = packed_inputs(rng, 1, 64, [0, 13, 40])
        seg = np.concatenate([np.asarray(seg[:1]), np.where(np.arange(64) < 56, seg1, 0)])
        pos = np.concatenate([np.asarray(pos[:1]), np.where(np.arange(64) < 56, pos1, 0)])
        budget = jnp.full((2,), 2, jnp.int32)
        if scan_layers:  # the same parameters run unrolled next
            params = _perturbed_params(model, rng, ids, seg, pos, budget)
        got = np.asarray(model.apply({"params": params}, ids, jnp.asarray(seg), jnp.asarray(pos),
                                     budget))
        want = _reference_logits(params, cfg, np.asarray(ids), seg, pos)
        real = seg > 0
        # float32 against float64: the kernels' float32 bound.
        np.testing.assert_allclose(got[real], want[real], rtol=1e-5,
                                   atol=1e-5 * np.abs(want[real]).max())


def test_rotary_positions_are_relative_and_used():
    """Shifting every position of a row by one constant leaves the logits unchanged (attention
    sees only position differences), while positions that change their differences change
    them."""
    rng = np.random.default_rng()
    cfg = tiny_config()
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    ids, seg, pos = packed_inputs(rng, 2, 64, [0, 30])
    budget = jnp.full((2,), 2, jnp.int32)
    params = _perturbed_params(model, rng, ids, seg, pos, budget)
    logits = jax.jit(lambda positions: model.apply({"params": params}, ids, seg, positions,
                                                   budget))
    base = np.asarray(logits(pos))
    shifted = np.asarray(logits(pos + jnp.asarray(rng.integers(1, 200, (2, 1)), jnp.int32)))
    # float32 angles at positions past 200 round to ~1e-5 rad: the shift moves logits by up to
    # ~1e-5 of their scale (measured over ten seeds), bounded here at 1e-4.
    np.testing.assert_allclose(shifted, base, rtol=1e-4, atol=1e-4 * np.abs(base).max())
    stretched = np.asarray(logits(pos * 3))
    assert np.abs(stretched - base).max() > 1e-2 * np.abs(base).max()
