"""Pure-jnp dense masked references: MoBA attention and the gate's definition.

Quadratic in T in time and memory; for tests and small checks only.
`reference_gate_scores` computes gate scores from the general per-(block,
document) definition directly; tests check `gating.gate_scores` against it.
`moba_reference` selects blocks with `gating.gate_scores` itself: two different
summation orders of the same scores can rank near-tied blocks differently, and a
single flipped choice would hide kernel errors behind selection noise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.moba import gating

_HIGHEST = lax.Precision.HIGHEST


def reference_gate_scores(q_BTHD, k_BTKD, segment_ids_BT, *, block_size: int) -> jax.Array:
  """[B, T, G, N] gate scores: group query . mean of block j's keys of the token's document."""
  b, t, hkv, d = k_BTKD.shape
  n = t // block_size
  seg_BNP = segment_ids_BT.reshape(b, n, block_size)
  same_BTNP = (segment_ids_BT[:, :, None, None] == seg_BNP[:, None]) & (
      segment_ids_BT[:, :, None, None] != 0)
  k_BNPGD = k_BTKD.astype(jnp.float32).reshape(b, n, block_size, hkv, d)
  ksum_BTNGD = jnp.einsum("btnp,bnpgd->btngd", same_BTNP.astype(jnp.float32), k_BNPGD,
                          precision=_HIGHEST)
  cnt_BTN = same_BTNP.sum(-1)
  qg_BTGD = q_BTHD.astype(jnp.float32).reshape(b, t, hkv, -1, d).sum(3)
  gkey_BTNGD = ksum_BTNGD / jnp.maximum(cnt_BTN, 1)[..., None, None]
  scores_BTGN = gating.gate_dot("btgd,btngd->btgn", qg_BTGD, gkey_BTNGD)
  own_BT1 = (jnp.arange(t) // block_size)[None, :, None]
  eligible_BTN = (jnp.arange(n)[None, None, :] < own_BT1) & (cnt_BTN > 0)
  return jnp.where(eligible_BTN[:, :, None, :], scores_BTGN, -jnp.inf)


def moba_reference(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *, block_size: int,
                   k_max: int) -> jax.Array:
  """Dense masked MoBA attention with the same signature as `moba_attention`."""
  gating.validate_shapes(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B,
                         block_size=block_size, k_max=k_max)
  ok_B = gating.check_budget(budget_B, k_max=k_max)
  b, t, hq, d = q_BTHD.shape
  hkv = k_BTKD.shape[2]
  gh = hq // hkv
  scores_BTGN = gating.gate_scores(lax.stop_gradient(q_BTHD), lax.stop_gradient(k_BTKD),
                                   segment_ids_BT.astype(jnp.int32), block_size=block_size)
  sel = gating.select_blocks(scores_BTGN, segment_ids_BT, budget_B.astype(jnp.int32),
                             block_size=block_size, k_max=k_max)
  key_block_T = jnp.arange(t) // block_size
  # allowed[b, t, g, u]: token t (group g) reads key u's block.
  reads_BTGU = (sel.selected_BTGK[..., None] == key_block_T).any(axis=3)
  same_doc_BTU = (segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]) & (
      segment_ids_BT[:, :, None] != 0)
  causal_TU = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
  allowed_BTGU = reads_BTGU & (same_doc_BTU & causal_TU)[:, :, None, :]
  allowed_BHTU = jnp.repeat(jnp.transpose(allowed_BTGU, (0, 2, 1, 3)), gh, axis=1)
  k_BTHD = jnp.repeat(k_BTKD, gh, axis=2).astype(jnp.float32)
  v_BTHD = jnp.repeat(v_BTKD, gh, axis=2).astype(jnp.float32)
  s_BHTU = jnp.einsum("bthd,buhd->bhtu", q_BTHD.astype(jnp.float32), k_BTHD,
                      precision=_HIGHEST) / jnp.sqrt(jnp.float32(d))
  s_BHTU = jnp.where(allowed_BHTU, s_BHTU, -1e30)
  p_BHTU = jax.nn.softmax(s_BHTU, axis=-1)
  o_BTHD = jnp.einsum("bhtu,buhd->bthd", p_BHTU, v_BTHD, precision=_HIGHEST)
  o_BTHD = jnp.where((segment_ids_BT != 0)[:, :, None, None], o_BTHD, 0.0)
  o_BTHD = jnp.where(ok_B[:, None, None, None], o_BTHD, jnp.nan)
  return o_BTHD.astype(q_BTHD.dtype)
