"""The KV-centric layout the attention kernels run on (`MobaKVLayout`, from
`build_kv_layout`): the gate's query-centric selection (gating.MobaSelection) transposed.
For every (row, KV group) the (token, slot, query head) triples are sorted by the block they
read, each block's run padded to a multiple of `block_rows`, so every `block_rows` chunk of
the sorted list reads exactly one KV block. Per chunk: its block id (-1 = unused chunk) and
whether it attends its block whole (`full_chunks`, `attended_key_tiles`); per block: its
first and one-past-last chunk. This plays the part of splash attention's MaskInfo.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from pallas_kernels.moba.gating import MobaSelection


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MobaKVLayout:
  """KV-centric layout over L sorted rows (a multiple of block_rows) per (row, group).

  row_src_BGL: int32 index into the flattened (token, query head) axis (T * Hq)
    of the query each sorted row holds; 0 on padding rows (masked by seg).
  row_seg_BGL / row_pos_BGL: int32 segment id (0 on padding rows) and token
    position (T on padding rows) of each sorted row; the kernels mask with them.
    Within a block's run rows are in position order, own-block tokens first.
  entry_row_BGTK: int32 sorted row of (token, slot, head 0); heads follow
    contiguously. Meaningless where the slot is unused.
  chunk_block_BGC: int32 KV block read by each chunk of block_rows rows, -1 if unused (past
    the runs, or padding rows only).
  chunk_full_BGC: int32 1 where the chunk attends every (row, key) pair of its block - no
    padding row, one document on both sides, not a row's own block - so the kernels may
    skip the mask there (splash attention's "full" blocks); else 0.
  block_chunks_BGN2: int32 [first chunk, one-past-last chunk] of each KV block.
  run_rows: (static) every block's run starts and ends on a multiple of this many rows
    (build_kv_layout's pad_rows), so that runs of run_rows rows read one block each.
  """

  row_src_BGL: jax.Array
  row_seg_BGL: jax.Array
  row_pos_BGL: jax.Array
  entry_row_BGTK: jax.Array
  chunk_block_BGC: jax.Array
  chunk_full_BGC: jax.Array
  block_chunks_BGN2: jax.Array
  run_rows: int = dataclasses.field(metadata=dict(static=True))


# Tokens per chunk of _read_ranks' running count, and the most it may take: every count is
# exact in its bf16 product up to 256 (bf16 holds every integer up to 2^8 exactly).
_RANK_CHUNK = 128
_RANK_CHUNK_MAX = 256


def _read_ranks(sel_BGTK, n: int, chunk: int = _RANK_CHUNK) -> tuple[jax.Array, jax.Array]:
  """For every (token, slot): how many earlier tokens of the (row, group) read the slot's
  block (int32 [B, G, T, K]; meaningless on unused slots), and how many tokens read each
  block (int32 [B, G, N]).

  Per chunk of tokens, a running count of each block's readers as a lower-triangular 0/1
  matmul (bf16 out: every partial sum is an integer <= chunk <= 256, so exact), read at each
  slot's block, plus the readers in the chunks before it (a short cumsum of chunk totals).
  (Counting by comparisons instead - the chunk's reads by block, each slot against the
  chunk's earlier slots - ran 2-8x slower on the H200 as XLA fused it; BENCHMARKS.md.)
  """
  if not 0 < chunk <= _RANK_CHUNK_MAX:
    raise ValueError(f"chunk={chunk} must be in 1..{_RANK_CHUNK_MAX}: a larger chunk's counts "
                     "are not exact in bf16")
  b, g, t, k = sel_BGTK.shape
  p = math.gcd(t, chunk)
  c = t // p
  reads_BGCPN = (sel_BGTK[..., None] == jnp.arange(n, dtype=jnp.int32)).any(axis=3).astype(
      jnp.bfloat16).reshape(b, g, c, p, n)
  tri_PQ = (jnp.arange(p)[:, None] >= jnp.arange(p)[None, :]).astype(jnp.bfloat16)
  within_BGCPN = jnp.einsum("pq,bgcqn->bgcpn", tri_PQ, reads_BGCPN,
                            preferred_element_type=jnp.bfloat16)
  return ranks_from_counts(within_BGCPN, sel_BGTK)


def ranks_from_counts(within_BGCPN, sel_BGTK) -> tuple[jax.Array, jax.Array]:
  """_read_ranks' outputs from each chunk's running count of each block's readers
  (inclusive, [B, G, C, P, N], exact in its dtype) and the selection [B, G, T, K]."""
  b, g, c, p, n = within_BGCPN.shape
  t, k = sel_BGTK.shape[2:]
  totals_BGCN = within_BGCPN[:, :, :, -1].astype(jnp.int32)
  before_BGCN = jnp.cumsum(totals_BGCN, axis=2, dtype=jnp.int32) - totals_BGCN
  blk_BGTK = jnp.minimum(sel_BGTK, n - 1)
  # Inclusive of the token itself, which reads the block on every used slot.
  # (Block ids in range: sel_BGTK >= 0, clamped below n.)
  upto_BGTK = jnp.take_along_axis(within_BGCPN.reshape(b, g, t, n), blk_BGTK, axis=3,
                                  mode="promise_in_bounds")
  before_BGTK = jnp.take_along_axis(before_BGCN, blk_BGTK.reshape(b, g, c, p * k), axis=3,
                                    mode="promise_in_bounds").reshape(b, g, t, k)
  return (upto_BGTK.astype(jnp.int32) - 1 + before_BGTK,
          before_BGCN[:, :, -1] + totals_BGCN[:, :, -1])


def build_kv_layout(sel: MobaSelection, segment_ids_BT: jax.Array, *, num_blocks: int,
                    group_size: int, block_rows: int, mark_full: bool = True,
                    pad_rows: int | None = None) -> MobaKVLayout:
  """Transpose the selection into the KV-centric sorted-row layout the kernels read.

  Sort-free: a token's rank among the tokens that read block j is a count (see
  _read_ranks), not a sort of T * k_max keys. mark_full=False leaves chunk_full_BGC all
  zero (every chunk masked) and skips computing it: for kernels that do not skip masks.
  pad_rows (a multiple of block_rows; default block_rows): each block's run is padded to a
  multiple of it, so that runs of pad_rows rows also read one block each (the Hopper
  persistent forward's 128-row work items); chunks of padding only are unused (-1).
  """
  sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
  b, g, t, kmax = sel_BGTK.shape
  n, gh, r = num_blocks, group_size, block_rows
  pad = r if pad_rows is None else pad_rows
  if pad % r:
    raise ValueError(f"pad_rows={pad} must be a multiple of block_rows={r}")
  cap_rows = -(-(t * kmax * gh + n * (pad - 1)) // pad) * pad
  rank_BGTK, cnt_BGN = _read_ranks(sel_BGTK, n)
  padded_BGN = -(-(cnt_BGN * gh) // pad) * pad
  row_end_BGN = jnp.cumsum(padded_BGN, axis=-1).astype(jnp.int32)
  row_start_BGN = row_end_BGN - padded_BGN
  used_BGTK = sel_BGTK < n
  blk_BGTK = jnp.minimum(sel_BGTK, n - 1)
  start_BGTK = jnp.take_along_axis(row_start_BGN[:, :, None, :], blk_BGTK, axis=3,
                                   mode="promise_in_bounds")
  entry_row_BGTK = jnp.where(used_BGTK, start_BGTK + rank_BGTK * gh, cap_rows).astype(jnp.int32)
  # Inverse map: each row's (token, head) as token * Gh + head; -1 on padding rows.
  rows_BGE = (entry_row_BGTK[..., None] + jnp.arange(gh, dtype=jnp.int32)).reshape(b, g, -1)
  hq = g * gh
  src_BGE = jnp.broadcast_to(
      (jnp.arange(t, dtype=jnp.int32)[None, :, None, None] * hq
       + jnp.arange(g, dtype=jnp.int32)[:, None, None, None] * gh
       + jnp.arange(gh, dtype=jnp.int32)), (b, g, t, kmax, gh)).reshape(b, g, -1)
  bi, gi = jnp.arange(b)[:, None, None], jnp.arange(g)[None, :, None]
  src_BGL = jnp.full((b, g, cap_rows), -1, jnp.int32).at[bi, gi, rows_BGE].set(
      src_BGE, mode="drop")
  has_tok_BGL = src_BGL >= 0
  row_src_BGL = jnp.maximum(src_BGL, 0)
  tok_BGL = row_src_BGL // hq
  seg_BGL = jnp.take_along_axis(segment_ids_BT[:, None, :].astype(jnp.int32), tok_BGL, axis=-1,
                                mode="promise_in_bounds")
  row_seg_BGL = jnp.where(has_tok_BGL, seg_BGL, 0)
  num_chunks = cap_rows // r
  chunk_start_C = jnp.arange(num_chunks, dtype=jnp.int32) * r
  # Block of each chunk: how many blocks end at or before its first row.
  blk_BGC = (row_end_BGN[:, :, None, :] <= chunk_start_C[:, None]).sum(-1, dtype=jnp.int32)
  any_tok_BGC = has_tok_BGL.reshape(b, g, num_chunks, r).any(-1)
  chunk_block_BGC = jnp.where((blk_BGC < n) & any_tok_BGC, blk_BGC, -1).astype(jnp.int32)
  block_chunks_BGN2 = jnp.stack([row_start_BGN // r, row_end_BGN // r], axis=-1).astype(jnp.int32)
  row_pos_BGL = jnp.where(has_tok_BGL, tok_BGL, t)  # padding rows sort last in their run
  if mark_full:
    chunk_full_BGC = full_chunks(chunk_block_BGC, row_seg_BGL, row_pos_BGL, segment_ids_BT,
                                 num_blocks=n, block_rows=r)
  else:
    chunk_full_BGC = jnp.zeros_like(chunk_block_BGC)
  return MobaKVLayout(row_src_BGL=row_src_BGL, row_seg_BGL=row_seg_BGL, row_pos_BGL=row_pos_BGL,
                      entry_row_BGTK=entry_row_BGTK, chunk_block_BGC=chunk_block_BGC,
                      chunk_full_BGC=chunk_full_BGC, block_chunks_BGN2=block_chunks_BGN2,
                      run_rows=pad)


def full_chunks(chunk_block_BGC, row_seg_BGL, row_pos_BGL, segment_ids_BT, *, num_blocks,
                block_rows) -> jax.Array:
  """int32 [B, G, C]: 1 where a chunk attends every pair of its block (MobaKVLayout)."""
  return attended_key_tiles(chunk_block_BGC, row_seg_BGL, row_pos_BGL, segment_ids_BT,
                            num_blocks=num_blocks, block_rows=block_rows,
                            tile=segment_ids_BT.shape[1] // num_blocks)


def attended_key_tiles(chunk_block_BGC, row_seg_BGL, row_pos_BGL, segment_ids_BT, *, num_blocks,
                       block_rows, tile, ignore_padding_rows: bool = False) -> jax.Array:
  """int32 [B, G, C]: how many leading `tile`-key tiles of a chunk's block the chunk attends
  whole - every (row, key) pair - so a kernel can skip their mask; 0 for unused chunks.

  Needs the chunk's rows in one document, that document's keys filling the block; then the
  count is set by the chunk's first row: a key tile is whole when it ends at or before that
  row's position (a chunk of a later block attends all block_size / tile of them). Padding
  rows (segment 0) make the count 0, unless ignore_padding_rows: for kernels whose rows do
  not interact and whose padding rows' outputs are never read (the forward, dq), where they
  may attend anything."""
  b, g, c = chunk_block_BGC.shape
  n, r, t = num_blocks, block_rows, segment_ids_BT.shape[1]
  seg_BNS = segment_ids_BT.astype(jnp.int32).reshape(b, n, t // n)
  blk_seg_BN, blk_mixed_BN = seg_BNS[..., 0], (seg_BNS != seg_BNS[..., :1]).any(-1)
  rseg_BGCR = row_seg_BGL.reshape(b, g, c, r)
  rpos_BGCR = row_pos_BGL.reshape(b, g, c, r)
  counted_BGCR = (rseg_BGCR != 0) if ignore_padding_rows else jnp.ones_like(rseg_BGCR, bool)
  doc_BGC = jnp.max(rseg_BGCR, -1)  # the chunk's document, if its counted rows share one
  j_BGC = jnp.maximum(chunk_block_BGC, 0)
  one_doc_BGC = ((chunk_block_BGC >= 0) & (doc_BGC != 0)
                 & jnp.where(counted_BGCR, rseg_BGCR == doc_BGC[..., None], True).all(-1)
                 & (doc_BGC == jnp.take_along_axis(blk_seg_BN[:, None], j_BGC, axis=-1))
                 & ~jnp.take_along_axis(blk_mixed_BN[:, None], j_BGC, axis=-1))
  first_BGC = jnp.where(counted_BGCR, rpos_BGCR, t).min(-1) - j_BGC * (t // n)
  tiles_BGC = jnp.clip((first_BGC + 1) // tile, 0, (t // n) // tile)
  return jnp.where(one_doc_BGC, tiles_BGC, 0).astype(jnp.int32)
