"""MoBA gating: block eligibility, gate scores, top-(k_b - 1) selection and coverage.

This module owns the selection step - its XLA reference (`moba_gate`, with coverage), its
Pallas kernel (`moba_gate_topk`, Triton lowering, behind `fused_gate`: moba_attention's
gate; from 256 blocks it ranks them in chunks and a second kernel merges the chunks' picks) -
and its layout, `MobaSelection` (query-centric, from `moba_gate` or `fused_gate`): for every
query token and KV head group, the selected KV block ids (slot 0 = the token's own block) and
how many slots are in use, plus the token's coverage (moba_gate only). kv_layout.py
transposes it into the KV-centric layout the attention kernels run on.

One gate key per block (the mean of its trailing document's keys) is exact
under the package's segment-id rule (documents are contiguous spans; see the
package docstring); scores are float32 (three-pass bf16 matmul, ~1e-5 relative).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_HIGHEST = lax.Precision.HIGHEST
# Blocks per matrix product of gate_keys (at most; a divisor of the block count).
_GATE_KEY_GROUP = 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MobaSelection:
  """Query-centric selection (B rows, T tokens, G = Hkv groups, K = k_max slots).

  selected_BTGK: int32 block ids; slot 0 is the token's own block, slots
    1..count-1 the chosen earlier blocks by descending gate score; unused slots
    and every slot of a padding token hold the sentinel `num_blocks`.
  count_BTG: int32 slots in use (0 for padding tokens, else 1 + chosen blocks).
  coverage_BTG: float32 share of the softmax over eligible gate scores held by the
    chosen blocks; 1.0 where nothing is eligible (and for padding tokens). None
    inside moba_attention, whose fused gate kernel does not compute it.
  """

  selected_BTGK: jax.Array
  count_BTG: jax.Array
  coverage_BTG: jax.Array


def group_queries(q_BTHD: jax.Array, num_kv_heads: int) -> jax.Array:
  """Sum of the query heads of each KV group, float32 (as is when Gh = 1)."""
  b, t, hq, d = q_BTHD.shape
  if hq == num_kv_heads:
    return q_BTHD
  q_BTGhD = q_BTHD.astype(jnp.float32).reshape(b, t, num_kv_heads, hq // num_kv_heads, d)
  return q_BTGhD.sum(axis=3)


def gate_dot(spec: str, x, y) -> jax.Array:
  """float32 einsum as bf16 tensor-core passes ((hi*hi + hi*lo) + lo*hi).

  Relative error ~1e-5; a full-f32 CUDA-core matmul costs several times more on
  GPU. The hi part is cut with reduce_precision, which XLA keeps (a plain
  f32->bf16->f32 round trip may be folded away under excess precision, leaving
  lo = 0). A bf16 operand is exact in one part. The Pallas gate kernel sums the
  same three products in the same order.
  """
  (xh, xl), (yh, yl) = split_bf16(x), split_bf16(y)
  dot = functools.partial(jnp.einsum, spec, preferred_element_type=jnp.float32)
  out = dot(xh, yh)
  if yl is not None:
    out = out + dot(xh, yl)
  if xl is not None:
    out = out + dot(xl, yh)
  return out


def gate_keys(k_BTKD, segment_ids_BT, *, block_size: int):
  """One gate key per block and KV head, float32 [B, N, G, D], and the block's
  trailing document id [B, N] (0 for an all-padding block).

  Under the contiguous-document rule, a token t in block i > j can only see block
  j through the document of block j's last non-padding token (its trailing
  document): t's document runs from block j to t with nothing but padding in
  between. So each block needs one gate key - the mean of its trailing document's
  keys - and (t, j) is eligible iff j < i and that document is t's.
  """
  b, t, hkv, d = k_BTKD.shape
  n = t // block_size
  seg_BNP = segment_ids_BT.reshape(b, n, block_size)
  pos_P = jnp.arange(block_size, dtype=jnp.int32)
  last_BN = jnp.max(jnp.where(seg_BNP != 0, pos_P, -1), axis=-1)
  trail_seg_BN = jnp.where(last_BN >= 0, jnp.take_along_axis(
      seg_BNP, jnp.maximum(last_BN, 0)[..., None], axis=-1)[..., 0], 0)
  in_trail_BNP = (seg_BNP == trail_seg_BN[..., None]) & (seg_BNP != 0)
  # The masked sum as a 0/1 matmul (exact products, float32 sums): XLA's GPU reduction of
  # the same sum moved the position axis minor first, a float32 transpose of all of k (about
  # 0.1 ms at S=32K, 16 x 128). One product per group of m consecutive blocks, its 0/1
  # operand block-diagonal [m, m * block_size], so that each product has m rows, not one (a
  # batch of matrix-vector products): 2 * m * T * Hkv * D multiply-adds in all, linear in T.
  m = math.gcd(n, _GATE_KEY_GROUP)
  eye_MM = jnp.eye(m, dtype=jnp.bool_)
  w_BOMQ = (eye_MM[None, None, :, :, None]
            & in_trail_BNP.reshape(b, n // m, 1, m, block_size)).reshape(
                b, n // m, m, m * block_size)
  ksum_BOMX = jnp.einsum("bomq,boqx->bomx", w_BOMQ.astype(k_BTKD.dtype),
                         k_BTKD.reshape(b, n // m, m * block_size, hkv * d),
                         preferred_element_type=jnp.float32,
                         precision=_HIGHEST if k_BTKD.dtype == jnp.float32 else None)
  gkey_BNGD = (ksum_BOMX.reshape(b, n, hkv * d)
               / jnp.maximum(in_trail_BNP.sum(-1), 1)[..., None]).reshape(b, n, hkv, d)
  return gkey_BNGD, trail_seg_BN.astype(jnp.int32)


def split_bf16(a):
  """(hi, lo) bf16 parts of a (lo None when a is bf16 already); see gate_dot."""
  if a.dtype == jnp.bfloat16:
    return a, None
  a = a.astype(jnp.float32)
  hi = lax.reduce_precision(a, exponent_bits=8, mantissa_bits=7)
  return hi.astype(jnp.bfloat16), (a - hi).astype(jnp.bfloat16)


def gate_eligible(segment_ids_BS, trail_seg_BN, *, block_size: int, query_stride: int = 1
                  ) -> jax.Array:
  """[B, S, N]: block j is eligible for query s, token s * query_stride (see gate_keys);
  segment_ids_BS: those tokens' segment ids."""
  s, n = segment_ids_BS.shape[1], trail_seg_BN.shape[1]
  own_S = jnp.arange(s, dtype=jnp.int32) * query_stride // block_size
  return ((jnp.arange(n)[None, None, :] < own_S[None, :, None])
          & (trail_seg_BN[:, None, :] == segment_ids_BS[:, :, None])
          & (segment_ids_BS[:, :, None] != 0))


def gate_scores(q_BSHD, k_BTKD, segment_ids_BT, *, block_size: int, query_stride: int = 1):
  """Gate scores [B, S, G, N] (float32, -inf where a block is not eligible) of the queries
  q_BSHD of tokens 0, query_stride, 2 * query_stride, ... (S = ceil(T / query_stride); with
  the default stride 1, every token) against the blocks of all T keys."""
  t = segment_ids_BT.shape[1]
  if q_BSHD.shape[1] != -(-t // query_stride):
    raise ValueError(f"q has {q_BSHD.shape[1]} tokens; query_stride={query_stride} over T={t} "
                     f"takes {-(-t // query_stride)}")
  gkey_BNGD, trail_seg_BN = gate_keys(k_BTKD, segment_ids_BT, block_size=block_size)
  qg_BSGD = group_queries(q_BSHD, k_BTKD.shape[2])
  scores_BSGN = gate_dot("bsgd,bngd->bsgn", qg_BSGD, gkey_BNGD)
  eligible_BSN = gate_eligible(segment_ids_BT[:, ::query_stride], trail_seg_BN,
                               block_size=block_size, query_stride=query_stride)
  return jnp.where(eligible_BSN[:, :, None, :], scores_BSGN, -jnp.inf)


def _top_k(x, k: int):
  """lax.top_k semantics (descending; ties: lower index first). For small k, k
  argmax passes beat XLA's GPU top-k on short rows."""
  if k == 0:
    return x[..., :0], jnp.zeros(x.shape[:-1] + (0,), jnp.int32)
  if k > 8:
    return lax.top_k(x, k)
  n_N = jnp.arange(x.shape[-1], dtype=jnp.int32)
  vals, idxs = [], []
  for _ in range(k):
    idx = jnp.argmax(x, axis=-1).astype(jnp.int32)
    vals.append(jnp.take_along_axis(x, idx[..., None], axis=-1)[..., 0])
    idxs.append(idx)
    x = jnp.where(n_N == idx[..., None], -jnp.inf, x)
  return jnp.stack(vals, -1), jnp.stack(idxs, -1)


def selection_from_picks(idx_BTGK, found_BTGK, segment_ids_BT, budget_B, *, block_size: int,
                         num_blocks: int, coverage_BTG=None) -> MobaSelection:
  """MobaSelection from the ranked eligible blocks (idx, and whether each slot found one)."""
  b, t = segment_ids_BT.shape
  g = idx_BTGK.shape[2]
  n = num_blocks
  nonpad_BT = segment_ids_BT != 0
  own_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32) // block_size, (b, t))
  own_BTG1 = jnp.broadcast_to(jnp.where(nonpad_BT, own_BT, n)[:, :, None, None], (b, t, g, 1))
  slot_K = jnp.arange(1, idx_BTGK.shape[3] + 1)
  chosen_BTGK = found_BTGK & (slot_K < budget_B[:, None, None, None])
  picked_BTGK = jnp.where(chosen_BTGK, idx_BTGK, n).astype(jnp.int32)
  count_BTG = jnp.where(nonpad_BT[..., None], 1 + chosen_BTGK.sum(-1), 0).astype(jnp.int32)
  return MobaSelection(selected_BTGK=jnp.concatenate([own_BTG1.astype(jnp.int32), picked_BTGK], -1),
                       count_BTG=count_BTG, coverage_BTG=coverage_BTG)


def select_blocks(scores_BTGN, segment_ids_BT, budget_B, *, block_size: int, k_max: int
                  ) -> MobaSelection:
  """Top-(k_b - 1) eligible blocks + own block, and coverage, from gate scores."""
  n = scores_BTGN.shape[-1]
  top_BTGK, idx_BTGK = _top_k(scores_BTGN, k_max - 1)
  found_BTGK = jnp.isfinite(top_BTGK)
  sel = selection_from_picks(idx_BTGK, found_BTGK, segment_ids_BT, budget_B,
                             block_size=block_size, num_blocks=n)
  # Each token's coverage at its row's budget (a budget out of range: moba_gate's NaN).
  at_B111 = (jnp.clip(budget_B, 1, k_max) - 1)[:, None, None, None]
  coverage_BTG = jnp.take_along_axis(_coverage_by_budget(scores_BTGN, top_BTGK, k_max), at_B111,
                                     axis=-1)[..., 0]
  return dataclasses.replace(sel, coverage_BTG=coverage_BTG.astype(jnp.float32))


def _coverage_by_budget(scores_BTGN, top_BTGK, k_max: int) -> jax.Array:
  """Each (token, KV group)'s coverage at every budget 1..k_max [B, T, G, k_max] (column j:
  budget j + 1): the softmax mass of its j highest eligible blocks (top_BTGK, ranked) over all
  of its eligible ones, a running sum down the ranking; exactly 1 once every eligible block is
  chosen, or when none is eligible."""
  eligible_BTGN = jnp.isfinite(scores_BTGN)
  mx_BTG = jnp.max(scores_BTGN, axis=-1)
  mx_BTG = jnp.where(jnp.isfinite(mx_BTG), mx_BTG, 0.0)
  total_BTG = jnp.where(eligible_BTGN, jnp.exp(scores_BTGN - mx_BTG[..., None]), 0.0).sum(-1)
  e_top_BTGK = jnp.where(jnp.isfinite(top_BTGK), jnp.exp(top_BTGK - mx_BTG[..., None]), 0.0)
  # Budget 1 chooses no block: mass 0. Budget k: the first k - 1 ranked blocks.
  mass_BTGK = jnp.concatenate([jnp.zeros_like(total_BTG)[..., None],
                               jnp.cumsum(e_top_BTGK, axis=-1)], -1)
  cov_BTGK = jnp.clip(mass_BTGK / jnp.maximum(total_BTG, 1e-30)[..., None], 0.0, 1.0)
  all_BTGK = jnp.arange(k_max) >= eligible_BTGN.sum(-1)[..., None]  # no rounding slack
  return jnp.where(all_BTGK | (total_BTG <= 0)[..., None], 1.0, cov_BTGK)


def validate_shapes(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *, block_size: int,
                    k_max: int) -> None:
  """Static checks, and check_segments' rule where the ids are concrete; each error names the
  argument at fault."""
  if q_BTHD.ndim != 4:
    raise ValueError(f"q_BTHD must be [B, T, Hq, D], got shape {q_BTHD.shape}")
  b, t, hq, d = q_BTHD.shape
  for name, x in (("k_BTKD", k_BTKD), ("v_BTKD", v_BTKD)):
    if x is None:
      continue
    if x.ndim != 4 or x.shape[0] != b or x.shape[1] != t or x.shape[3] != d:
      raise ValueError(f"{name} must be [B={b}, T={t}, Hkv, D={d}], got {x.shape}")
  hkv = k_BTKD.shape[2]
  if v_BTKD is not None and v_BTKD.shape != k_BTKD.shape:
    raise ValueError(f"v_BTKD shape {v_BTKD.shape} must equal k_BTKD shape {k_BTKD.shape}")
  if hq % hkv != 0:
    raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hkv}) (Hq % Hkv != 0)")
  if segment_ids_BT.shape != (b, t) or not jnp.issubdtype(segment_ids_BT.dtype, jnp.integer):
    raise ValueError(f"segment_ids_BT must be integer [B={b}, T={t}], got "
                     f"{segment_ids_BT.dtype}{segment_ids_BT.shape}")
  if budget_B.shape != (b,) or not jnp.issubdtype(budget_B.dtype, jnp.integer):
    raise ValueError(f"budget_B must be integer [B={b}], got {budget_B.dtype}{budget_B.shape}")
  if block_size < 1 or t % block_size != 0:
    raise ValueError(f"T={t} must be a multiple of block_size={block_size}")
  n = t // block_size
  if not 1 <= k_max <= n:
    raise ValueError(f"k_max={k_max} must be in [1, number of blocks T/block_size={n}]")
  for name, x in (("q_BTHD", q_BTHD), ("k_BTKD", k_BTKD), ("v_BTKD", v_BTKD)):
    if x is not None and x.dtype not in (jnp.bfloat16, jnp.float32):
      raise ValueError(f"{name} dtype must be bfloat16 or float32, got {x.dtype}")
  check_head_dim(d)
  check_segments(segment_ids_BT)


def check_head_dim(d: int) -> None:
  """The head widths the kernels take: a power of two >= 16 (their tiles; Triton's dot takes
  no other widths)."""
  if d < 16 or d & (d - 1):
    raise ValueError(f"q_BTHD head_dim D={d} must be a power of two >= 16 (the kernels' tiles; "
                     "Triton's dot takes no other widths)")


def check_budget(budget_B: jax.Array, *, k_max: int) -> jax.Array:
  """Budget range check. A concrete budget_B out of [1, k_max] raises ValueError
  here. A traced one cannot raise without a host round trip (about 1 ms per call
  on the H200, measured): the in-range mask is returned instead, and the callers
  turn rows out of range into NaN (output, coverage), which no training step hides."""
  if not isinstance(budget_B, jax.core.Tracer):
    values = np.asarray(budget_B)
    bad = np.nonzero((values < 1) | (values > k_max))[0]
    if bad.size:
      raise ValueError(f"budget_B must lie in [1, k_max={k_max}]; rows {bad.tolist()} hold "
                       f"{values[bad].tolist()}")
  return (budget_B >= 1) & (budget_B <= k_max)


def check_segments(segment_ids_BT: jax.Array) -> None:
  """The segment-id rule (package docstring: 0 = padding, documents > 0, between two tokens of
  a document only its tokens or padding), checked where segment_ids_BT is concrete: a
  violation raises ValueError naming the row. Traced ids are the caller's contract (the gate's
  per-document keys assume it and would silently differ); the project's packer writes ids
  1, 2, ... in row order."""
  if isinstance(segment_ids_BT, jax.core.Tracer):
    return
  ids_BT = np.asarray(segment_ids_BT)
  negative = np.nonzero((ids_BT < 0).any(axis=1))[0]
  if negative.size:
    raise ValueError(f"segment_ids_BT must be >= 0 (0 = padding, documents > 0); rows "
                     f"{negative.tolist()} hold negative ids")
  too_big = np.nonzero((ids_BT > np.iinfo(np.int32).max).any(axis=1))[0]
  if too_big.size:
    raise ValueError(f"segment_ids_BT must fit int32, as the kernels read them; rows "
                     f"{too_big.tolist()} hold ids above {np.iinfo(np.int32).max}")
  # Padding may lie inside a document; among the row's document tokens a run of one id starts
  # where the id changes, and an id starting two runs (another document between) is a
  # document in pieces.
  for b in range(ids_BT.shape[0]):
    docs = ids_BT[b][ids_BT[b] != 0]
    starts = docs[np.concatenate([[True], docs[1:] != docs[:-1]])] if docs.size else docs
    values, counts = np.unique(starts, return_counts=True)
    if (counts > 1).any():
      raise ValueError(f"segment_ids_BT row {b}: document ids {values[counts > 1].tolist()} "
                       "each hold tokens on both sides of another document; a document must "
                       "be one span of its row (only padding may interrupt it)")


def moba_gate(q_BTHD, k_BTKD, segment_ids_BT, budget_B, *, block_size: int, k_max: int
              ) -> MobaSelection:
  """Selected blocks (indices + per-token counts) and per-token coverage."""
  validate_shapes(q_BTHD, k_BTKD, None, segment_ids_BT, budget_B, block_size=block_size,
                  k_max=k_max)
  ok_B = check_budget(budget_B, k_max=k_max)
  q_BTHD, k_BTKD = lax.stop_gradient(q_BTHD), lax.stop_gradient(k_BTKD)
  scores_BTGN = gate_scores(q_BTHD, k_BTKD, segment_ids_BT, block_size=block_size)
  sel = select_blocks(scores_BTGN, segment_ids_BT, budget_B.astype(jnp.int32),
                      block_size=block_size, k_max=k_max)
  return dataclasses.replace(sel, coverage_BTG=jnp.where(ok_B[:, None, None], sel.coverage_BTG,
                                                         jnp.nan))


def moba_coverage(q_BTHD, k_BTKD, segment_ids_BT, budget_B, *, block_size: int, k_max: int
                  ) -> jax.Array:
  """Mean coverage per row over its non-padding tokens and KV groups, float32 [B]."""
  sel = moba_gate(q_BTHD, k_BTKD, segment_ids_BT, budget_B, block_size=block_size, k_max=k_max)
  return _row_mean(1.0 - (1.0 - sel.coverage_BTG).mean(-1), segment_ids_BT)


def _row_mean(per_token_BTX, segment_ids_BT) -> jax.Array:
  """Mean over each row's non-padding tokens [B, X...] (1 for a row of padding only, NaN for
  one whose tokens are NaN: a budget out of range).

  Averaged as 1 - the mean shortfall from 1, so that a row whose every token is covered reads
  exactly 1 (a sum of zeros), under jit too, where XLA may divide by a count as a product with
  its reciprocal (121 x fl(1/121) = 0.99999994): a coverage floor of 1.0 stays reachable."""
  nonpad_BT = (segment_ids_BT != 0).astype(jnp.float32)
  nonpad = nonpad_BT.reshape(nonpad_BT.shape + (1,) * (per_token_BTX.ndim - 2))
  n_B = nonpad.sum(1)
  short_B = ((1.0 - per_token_BTX) * nonpad).sum(1)
  return jnp.where(n_B > 0, 1.0 - short_B / jnp.maximum(n_B, 1),
                   jnp.where(jnp.isnan(short_B), jnp.nan, 1.0))


def moba_coverage_curve(q_BSHD, k_BTKD, segment_ids_BT, *, block_size: int, k_max: int,
                        query_stride: int = 1) -> jax.Array:
  """`moba_coverage` of every row at every budget 1..k_max at once, float32 [B, k_max]
  (column j: budget j + 1), from one gate pass: a token's coverage at budget k is the mass of
  its k - 1 highest eligible blocks, a running sum down its ranked blocks. What the DST tuner's
  coverage floor reads: one device call per step, whatever budgets it weighs.

  query_stride > 1 averages over the queries of every query_stride-th token only (tokens 0,
  stride, 2 * stride, ...; q_BSHD holds just those, S = ceil(T / stride)), scored against the
  blocks of all T keys: the same mean over a systematic sample of the row's tokens, at about
  1 / stride of the query-side work (the ranking's sort, the grouped queries, their
  projection in the caller)."""
  if query_stride < 1:
    raise ValueError(f"query_stride must be >= 1, got {query_stride}")
  # Shape checks on a stand-in of all T queries; gate_scores checks the sampled q's length.
  q_all = q_BSHD if q_BSHD.ndim != 4 else jax.ShapeDtypeStruct(
      (q_BSHD.shape[0], segment_ids_BT.shape[-1]) + q_BSHD.shape[2:], q_BSHD.dtype)
  validate_shapes(q_all, k_BTKD, None, segment_ids_BT, jnp.ones((q_BSHD.shape[0],), jnp.int32),
                  block_size=block_size, k_max=k_max)
  q_BSHD, k_BTKD = lax.stop_gradient(q_BSHD), lax.stop_gradient(k_BTKD)
  scores_BSGN = gate_scores(q_BSHD, k_BTKD, segment_ids_BT, block_size=block_size,
                            query_stride=query_stride)
  top_BSGK, _ = _top_k(scores_BSGN, k_max - 1)
  cov_BSGK = _coverage_by_budget(scores_BSGN, top_BSGK, k_max)
  segment_ids_BS = segment_ids_BT[:, ::query_stride]
  cov_BSK = jnp.where((segment_ids_BS != 0)[..., None], cov_BSGK.mean(2), 1.0)
  return _row_mean(cov_BSK, segment_ids_BS).astype(jnp.float32)


# Up to this many picks the gate makes every pass, unrolled, and drops the picks past the
# row's budget after: on the H200 (S=32K, 16/16 x 128, block 512) a loop of 2 passes took
# 0.089 ms where 2 unrolled took 0.078; at k_max 16 a loop of 2 took 0.094 where 15 unrolled
# took 0.238 (BENCHMARKS.md).
_UNROLLED_GATE_PICKS = 2


def _ranked_passes(s, pick_at, passes, *, num_picks: int, kpad: int, with_scores: bool):
  """In a kernel: the top of each row of s [tile, width] by passes of max / first-position-of-
  max (ties to the lower column), passes (traced) of them - looped past _UNROLLED_GATE_PICKS
  picks so that the time follows `passes`, else num_picks unrolled and the slots past
  `passes` cleared. pick_at(first, hit) gives the id recorded for each row's maximum (first:
  its column [tile], hit: that column as a [tile, width] mask). Returns the ids [tile, kpad]
  (-1 where a row has nothing left above -inf, and past `passes`) and, with_scores, their
  scores (-inf there); else None."""
  tile, width = s.shape
  at = jnp.arange(width, dtype=jnp.int32)
  slot = jnp.arange(kpad, dtype=jnp.int32)

  def one_pass(k, carry):
    s, picks, *vals = carry  # vals: the picks' scores, carried only where asked for
    m = jnp.max(s, axis=1)
    first = jnp.min(jnp.where(s == m[:, None], at[None, :], width), axis=1)
    hit = at[None, :] == first[:, None]
    here = (slot[None, :] == k) & (m > -jnp.inf)[:, None]
    picks = jnp.where(here, pick_at(first, hit)[:, None], picks)
    vals = [jnp.where(here, m[:, None], v) for v in vals]
    return jnp.where(hit, -jnp.inf, s), picks, *vals

  carry = (s, jnp.full((tile, kpad), -1, jnp.int32))
  if with_scores:
    carry += (jnp.full((tile, kpad), -jnp.inf, jnp.float32),)
  if num_picks > _UNROLLED_GATE_PICKS:
    _, picks, *vals = lax.fori_loop(0, passes, one_pass, carry)
  else:
    for k in range(num_picks):
      carry = one_pass(k, carry)
    kept = slot[None, :] < passes
    _, picks, *vals = carry
    picks, vals = jnp.where(kept, picks, -1), [jnp.where(kept, v, -jnp.inf) for v in vals]
  return picks, (vals[0] if with_scores else None)


def _gate_kernel(passes_ref, qh_ref, *refs, block_size, num_picks, has_q_lo, chunks):
  """Scores of a tile of tokens against one chunk of the blocks (all of them where `chunks`
  is 1), eligibility, and the chunk's top block ids, all in registers, by _ranked_passes:
  passes_ref[0] of them (the row's budget less its own block), so that the gate's time
  follows the budget, not the compiled k_max. Program (b, g, i * chunks + c)
  scores token tile i against block chunk c; with several chunks it also writes each pick's
  score (-inf past the found ones) for moba_gate_topk's merge, and a chunk that starts at or
  after the tile's last own block (nothing in it eligible) computes nothing."""
  if has_q_lo:
    ql_ref, gh_ref, gl_ref, trail_ref, seg_ref, *outs = refs
  else:
    ql_ref, (gh_ref, gl_ref, trail_ref, seg_ref, *outs) = None, refs
  out_ref = outs[0]
  val_ref = outs[1] if chunks > 1 else None
  tile, kpad = out_ref.shape
  width = gh_ref.shape[0]
  pid = pl.program_id(2)
  i, c = (pid, 0) if chunks == 1 else (pid // chunks, lax.rem(pid, chunks))

  def pick():
    qh = qh_ref[...]
    gh = gh_ref[...]
    s = plgpu.dot(qh, gh, trans_b=True) + plgpu.dot(qh, gl_ref[...], trans_b=True)
    if has_q_lo:
      s = s + plgpu.dot(ql_ref[...], gh, trans_b=True)
    seg = seg_ref[...]
    own = (i * tile + jnp.arange(tile, dtype=jnp.int32)) // block_size
    blk = c * width + jnp.arange(width, dtype=jnp.int32)
    eligible = ((blk[None, :] < own[:, None]) & (trail_ref[...][None, :] == seg[:, None])
                & (seg[:, None] != 0))
    s = jnp.where(eligible, s, -jnp.inf)
    picks, vals = _ranked_passes(s, lambda first, hit: c * width + first, passes_ref[0],
                                 num_picks=num_picks, kpad=kpad,
                                 with_scores=val_ref is not None)
    out_ref[...] = picks
    if val_ref is not None:
      val_ref[...] = vals

  if chunks == 1:
    pick()
    return
  last_own = ((i + 1) * tile - 1) // block_size
  pl.when(c * width < last_own)(pick)

  @pl.when(c * width >= last_own)
  def _nothing_eligible():
    out_ref[...] = jnp.full((tile, kpad), -1, jnp.int32)
    val_ref[...] = jnp.full((tile, kpad), -jnp.inf, jnp.float32)


# Scores a gate program holds in registers at most (tokens x blocks of one program).
_GATE_SCORES = 8192
# The most picks for which the gate's default takes block chunks (from 256 blocks): on the H200
# at S=64K, block 256 the chunks took 0.43 / 1.02 ms against one chunk's 0.96 / 1.61 at k = 3 /
# 8, and 3.00 / 7.88 against 2.57 / 4.34 at k = 16 / 32 (their passes and the merge's grow with
# the picks; BENCHMARKS.md).
_CHUNKED_GATE_MAX_PICKS = 8


def moba_gate_topk(qh_BTGD, ql_BTGD, gh_BNGD, gl_BNGD, trail_seg_BN, segment_ids_BT, *,
                   block_size: int, num_picks: int, interpret: bool, picks_B=None,
                   tile: int = 128, num_warps: int | None = None, chunk: int | None = None):
  """Top num_picks eligible blocks per (token, KV group): int32 [B, T, G, num_picks],
  best first, -1 where fewer are eligible. Inputs are the bf16 (hi, lo) parts of
  the group queries (lo may be None) and of the gate keys, as gating.gate_dot. picks_B
  (int [B], runtime data; None: num_picks for every row): row b's top min(picks_B[b],
  num_picks) only, its later slots -1 - from num_picks 3 on the passes the kernel makes, so
  that a budget below the compiled k_max costs its own picks, not k_max's. tile: tokens
  per program at most (halved until it divides T); num_warps: by default 8 for 128-token
  tiles over every block, else 4. On the H200 at S=32K, 16/16 x 128, block 512 (gate_tiles.py,
  BENCHMARKS.md) 128 tokens on 8 warps were the fastest, and 64 on 8 much slower than 64 on 4;
  over chunks 4 warps were 4-5% faster than 8.
  chunk: blocks per program (a power of two >= 16, tile * chunk <= 8192 scores in
  registers). Where the (padded) blocks take several chunks, each program ranks one chunk's
  blocks, a chunk wholly at or after the tile's own blocks costs nothing, and a second
  kernel merges the chunks' picks by score (ties: lower block first, as in one pass over
  every block): the work follows the eligible (token, block) pairs, about half of all under
  causality, and the products keep 128 tokens. Default: every block in one program while
  that leaves a tile of 64 tokens or more (up to 128 blocks) or, up to 512 blocks, num_picks is
  over 8, else chunks of 64 blocks beside 128 tokens (from 256 blocks: S=64K at block 256,
  where one chunk left 32-token tiles; past 8 picks the passes outweigh what the chunks save;
  past 512 blocks no tile of 16 tokens holds every block's scores)."""
  b, t, g, d = qh_BTGD.shape
  n = gh_BNGD.shape[1]
  npad = max(16, pl.next_power_of_2(n))
  kpad = pl.next_power_of_2(num_picks)
  while t % tile:
    tile //= 2
  if chunk is None:
    # Every block in one program while that leaves 64 tokens or more (as fast as chunks of
    # 128 tokens or faster at 128 blocks on the H200), or past _CHUNKED_GATE_MAX_PICKS while
    # the scores fit at all; else chunks beside 128 tokens.
    one_chunk_tile = tile
    while one_chunk_tile * npad > _GATE_SCORES and one_chunk_tile > 16:
      one_chunk_tile //= 2
    fits = one_chunk_tile * npad <= _GATE_SCORES
    if fits and (one_chunk_tile >= 64 or num_picks > _CHUNKED_GATE_MAX_PICKS):
      tile, chunk = one_chunk_tile, npad
    else:
      chunk = max(16, _GATE_SCORES // tile)
  if chunk < 16 or chunk & (chunk - 1) or tile * chunk > _GATE_SCORES:
    raise ValueError(f"chunk={chunk} must be a power of two >= 16 with tile * chunk <= "
                     f"{_GATE_SCORES} (tile={tile})")
  chunk = min(chunk, npad)
  chunks = npad // chunk
  if num_warps is None:
    num_warps = 8 if tile >= 128 and chunks == 1 else 4
  pad_n = lambda x: jnp.pad(x, [(0, 0), (0, npad - n)] + [(0, 0)] * (x.ndim - 2))
  q_spec = pl.BlockSpec((None, tile, None, d), lambda b_, g_, p: (b_, p // chunks, g_, 0))
  key_spec = pl.BlockSpec((None, chunk, None, d), lambda b_, g_, p: (b_, p % chunks, g_, 0))
  has_q_lo = ql_BTGD is not None
  kernel = functools.partial(_gate_kernel, block_size=block_size, num_picks=num_picks,
                             has_q_lo=has_q_lo, chunks=chunks)
  if picks_B is not None and picks_B.shape != (b,):
    raise ValueError(f"picks_B must be [B={b}], got shape {picks_B.shape}")
  passes_B = jnp.full((b,), num_picks, jnp.int32) if picks_B is None else picks_B
  passes_B = jnp.clip(passes_B.astype(jnp.int32), 0, num_picks)
  # Per program: its tile's picks (and, with several chunks, their scores) of its chunk.
  out_spec = pl.BlockSpec((None, tile, None, None, kpad),
                          lambda b_, g_, p: (b_, p // chunks, g_, p % chunks, 0))
  out_shape = [jax.ShapeDtypeStruct((b, t, g, chunks, kpad), jnp.int32)]
  if chunks > 1:
    out_shape.append(jax.ShapeDtypeStruct((b, t, g, chunks, kpad), jnp.float32))
  outs = pl.pallas_call(
      kernel,
      grid=(b, g, (t // tile) * chunks),
      in_specs=[pl.BlockSpec((1,), lambda b_, g_, p: (b_,)), q_spec] + [q_spec] * has_q_lo + [
          key_spec, key_spec, pl.BlockSpec((None, chunk), lambda b_, g_, p: (b_, p % chunks)),
          pl.BlockSpec((None, tile), lambda b_, g_, p: (b_, p // chunks))],
      out_specs=[out_spec] * len(out_shape),
      out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="moba_gate_topk",
  )(passes_B, qh_BTGD, *([ql_BTGD] if has_q_lo else []), pad_n(gh_BNGD), pad_n(gl_BNGD),
    pad_n(trail_seg_BN), segment_ids_BT.astype(jnp.int32))
  if chunks == 1:
    return outs[0][:, :, :, 0, :num_picks]
  return _merge_chunk_picks(passes_B, *(x.reshape(b, t, g, chunks * kpad) for x in outs),
                            num_picks=num_picks, interpret=interpret)


def _merge_kernel(passes_ref, pick_ref, val_ref, out_ref, *, num_picks):
  """A tile of tokens' top picks from their chunks' candidates (moba_gate_topk's merge), by
  the gate's passes over the candidates' scores in registers."""
  cand = pick_ref[...]
  picks, _ = _ranked_passes(
      val_ref[...], lambda first, hit: jnp.max(jnp.where(hit, cand, -1), axis=1),
      passes_ref[0], num_picks=num_picks, kpad=out_ref.shape[-1], with_scores=False)
  out_ref[...] = picks


def _merge_chunk_picks(passes_B, picks_BTGX, vals_BTGX, *, num_picks, interpret):
  """moba_gate_topk's picks from its chunks' candidates [B, T, G, chunks * kpad] (block
  order: chunk by chunk, each best first, ties at the lower block; -inf scores where nothing
  was found): the top num_picks by score, ties to the earlier candidate - the ranking of one
  pass over every block - and -1 past each row's passes. A kernel of its own: XLA's
  reductions over so short a minor axis ran at about a tenth of the memory's rate on the
  H200 (BENCHMARKS.md)."""
  b, t, g, width = vals_BTGX.shape
  kpad = pl.next_power_of_2(num_picks)
  tile = min(128, t, _GATE_SCORES // width)
  while t % tile:
    tile //= 2
  spec = lambda w: pl.BlockSpec((None, tile, None, w), lambda b_, g_, i: (b_, i, g_, 0))
  out = pl.pallas_call(
      functools.partial(_merge_kernel, num_picks=num_picks),
      grid=(b, g, t // tile),
      in_specs=[pl.BlockSpec((1,), lambda b_, g_, i: (b_,)), spec(width), spec(width)],
      out_specs=spec(kpad),
      out_shape=jax.ShapeDtypeStruct((b, t, g, kpad), jnp.int32),
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
      interpret=interpret,
      name="moba_gate_merge",
  )(passes_B, picks_BTGX, vals_BTGX)
  return out[..., :num_picks]


def gate_kernel_operands(q_BTHD, k_BTKD, segment_ids_BT, *, block_size: int):
  """moba_gate_topk's first five operands: the bf16 (hi, lo) parts of the group
  queries and of the gate keys, and the blocks' trailing document ids."""
  gkey_BNGD, trail_seg_BN = gate_keys(k_BTKD, segment_ids_BT, block_size=block_size)
  qh_BTGD, ql_BTGD = split_bf16(group_queries(q_BTHD, k_BTKD.shape[2]))
  gh_BNGD, gl_BNGD = split_bf16(gkey_BNGD)
  return qh_BTGD, ql_BTGD, gh_BNGD, gl_BNGD, trail_seg_BN


def fused_gate(q_BTHD, k_BTKD, segment_ids_BT, budget_B, *, block_size, k_max, interpret
               ) -> MobaSelection:
  """moba_gate's selection (no coverage) with scores and top-k in one kernel
  (moba_attention's gate)."""
  b, t, hq, d = q_BTHD.shape
  n = t // block_size
  if k_max == 1:
    picks_BTGK = jnp.zeros((b, t, k_BTKD.shape[2], 0), jnp.int32)
  else:
    picks_BTGK = moba_gate_topk(
        *gate_kernel_operands(q_BTHD, k_BTKD, segment_ids_BT, block_size=block_size),
        segment_ids_BT, block_size=block_size, num_picks=k_max - 1, interpret=interpret,
        picks_B=budget_B - 1)  # selection_from_picks reads no slot past a row's budget
  return selection_from_picks(jnp.maximum(picks_BTGK, 0), picks_BTGK >= 0, segment_ids_BT,
                              budget_B, block_size=block_size, num_blocks=n)
