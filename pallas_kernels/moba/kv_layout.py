"""The KV-centric layout the attention kernels run on (`MobaKVLayout`, from
`build_kv_layout`): the gate's query-centric selection (gating.MobaSelection) transposed.
For every (row, KV group) the (token, slot, query head) triples are sorted by the block they
read, each block's run padded to a multiple of `block_rows`, so every `block_rows` chunk of
the sorted list reads exactly one KV block. Per chunk: its block id (-1 = unused chunk) and
whether it attends its block whole (`full_chunks`, `attended_key_tiles`); per block: its
first and one-past-last chunk. This plays the part of splash attention's MaskInfo.

A token's place in a block's run is its rank among the tokens that read the block: counted by
XLA from a [B, G, T, N] running count (`_read_ranks`), or by a Pallas kernel per tile of
tokens (`tile_read_ranks`); the same layout either way.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

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
  t = sel_BGTK.shape[2]
  # Inclusive of the token itself, which reads the block on every used slot.
  # (Block ids in range: sel_BGTK >= 0, clamped below n.)
  upto_BGTK = jnp.take_along_axis(within_BGCPN.reshape(b, g, t, n),
                                  jnp.minimum(sel_BGTK, n - 1), axis=3, mode="promise_in_bounds")
  return _plus_earlier_chunks(upto_BGTK.astype(jnp.int32) - 1,
                              within_BGCPN[:, :, :, -1].astype(jnp.int32), sel_BGTK)


def _plus_earlier_chunks(rank_in_BGTK, totals_BGCN, sel_BGTK) -> tuple[jax.Array, jax.Array]:
  """Ranks within each chunk of T / C tokens (int32 [B, G, T, K]) made ranks in the whole
  row: plus the reads of each slot's block in the chunks before (from each chunk's reads of
  each block, int32 [B, G, C, N]); and each block's reader count [B, G, N]."""
  b, g, c, n = totals_BGCN.shape
  t, k = sel_BGTK.shape[2:]
  before_BGCN = jnp.cumsum(totals_BGCN, axis=2, dtype=jnp.int32) - totals_BGCN
  blk_BGCX = jnp.minimum(sel_BGTK, n - 1).reshape(b, g, c, (t // c) * k)
  before_BGTK = jnp.take_along_axis(before_BGCN, blk_BGCX, axis=3,
                                    mode="promise_in_bounds").reshape(b, g, t, k)
  return rank_in_BGTK + before_BGTK, before_BGCN[:, :, -1] + totals_BGCN[:, :, -1]


# tile_read_ranks: tokens per program, the warps that run one, and the most slots it takes (its
# comparisons grow with the square of the slots per token).
TILE_RANK_TOKENS = 64
TILE_RANK_WARPS = 4
TILE_RANK_MAX_SLOTS = 8


def tile_ranks_fit(num_tokens: int, k_max: int) -> bool:
  """Whether tile_read_ranks takes a selection of num_tokens tokens and k_max slots (where
  moba_attention's layout ranks by it: the running count's [B, G, T, N] products and reads
  cost more on the H200, BENCHMARKS.md)."""
  return k_max <= TILE_RANK_MAX_SLOTS and num_tokens % TILE_RANK_TOKENS == 0


def _tile_ranks_kernel(*refs, num_slots: int, own_apart: bool):
  """One tile of a (row, KV group)'s tokens: per slot, how many (token, slot) entries of the
  tile's earlier tokens read the same block (pairwise comparisons of the slots' block ids),
  and how many of the tile's entries read each block. own_apart: the tile lies in one KV
  block, so a token's own block (slot 0) is never another token's pick (picks precede the
  own block) and the own and picked slots are compared only among themselves."""
  sel_refs, rank_refs, hist_ref = refs[:num_slots], refs[num_slots:-1], refs[-1]
  cols = [ref[...] for ref in sel_refs]
  tile = cols[0].shape[0]
  at = jnp.arange(tile, dtype=jnp.int32)
  earlier = at[None, :] < at[:, None]  # [token, other token]
  for s, rank_ref in enumerate(rank_refs):
    count = jnp.zeros((tile,), jnp.int32)
    for s2 in range(num_slots):
      if own_apart and (s == 0) != (s2 == 0):
        continue
      same = (cols[s2][None, :] == cols[s][:, None]) & earlier
      count = count + jnp.sum(same.astype(jnp.int32), axis=1)
    rank_ref[...] = count
  blk = jnp.arange(hist_ref.shape[-1], dtype=jnp.int32)
  hist = jnp.zeros(blk.shape, jnp.int32)
  for col in cols:
    hist = hist + jnp.sum((col[:, None] == blk[None, :]).astype(jnp.int32), axis=0)
  hist_ref[...] = hist


def tile_read_ranks(sel_BTGK, n: int, *, block_size: int, interpret: bool,
                    tile: int = TILE_RANK_TOKENS, num_warps: int = TILE_RANK_WARPS
                    ) -> tuple[jax.Array, jax.Array]:
  """_read_ranks' outputs (int32 [B, G, T, K] ranks, [B, G, N] reader counts) from the
  query-centric selection [B, T, G, K] (block ids; unused slots >= n), by a Pallas kernel
  (Triton lowering; interpret: CPU) per tile of `tile` tokens of a (row, KV group) - the ranks
  among the tile's earlier tokens and the tile's reads of each block - then each tile's
  earlier reads of the slot's block added from a cumulative sum over the tiles ([B, G, T / tile,
  N]). Nothing of size T x N is made (_read_ranks' running count is [B, G, T, N]).
  Needs K <= TILE_RANK_MAX_SLOTS and `tile` (a power of two, at least 16) dividing T."""
  b, t, g, k = sel_BTGK.shape
  if k > TILE_RANK_MAX_SLOTS:
    raise ValueError(f"tile_read_ranks takes at most {TILE_RANK_MAX_SLOTS} slots per token, got "
                     f"{k}: its comparisons grow with their square (_read_ranks takes any)")
  if tile < 16 or tile & (tile - 1) or t % tile:
    raise ValueError(f"tile={tile} must be a power of two >= 16 dividing T={t}")
  c = t // tile
  # Block columns of the tile's read counts; unused slots (ids >= n) fall past them or into
  # the columns past n, which are dropped.
  npad = max(16, pl.next_power_of_2(n))
  sel_BTGK = sel_BTGK.astype(jnp.int32)
  slot_spec = lambda s: pl.BlockSpec((None, tile, None, None), lambda b_, g_, i: (b_, i, g_, s))
  *rank_BGT, hist_BGCX = pl.pallas_call(
      functools.partial(_tile_ranks_kernel, num_slots=k,
                        own_apart=block_size % tile == 0),
      grid=(b, g, c),
      in_specs=[slot_spec(s) for s in range(k)],
      out_specs=[pl.BlockSpec((None, None, tile), lambda b_, g_, i: (b_, g_, i))] * k
      + [pl.BlockSpec((None, None, None, npad), lambda b_, g_, i: (b_, g_, i, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, g, t), jnp.int32)] * k
      + [jax.ShapeDtypeStruct((b, g, c, npad), jnp.int32)],
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="moba_tile_ranks",
  )(*[sel_BTGK] * k)
  return _plus_earlier_chunks(jnp.stack(rank_BGT, axis=-1), hist_BGCX[..., :n],
                              jnp.transpose(sel_BTGK, (0, 2, 1, 3)))


def build_kv_layout(sel: MobaSelection, segment_ids_BT: jax.Array, *, num_blocks: int,
                    group_size: int, block_rows: int, mark_full: bool = True,
                    pad_rows: int | None = None, tile_ranks: bool = False,
                    interpret: bool = False) -> MobaKVLayout:
  """Transpose the selection into the KV-centric sorted-row layout the kernels read.

  Sort-free: a token's rank among the tokens that read block j is a count (see
  _read_ranks), not a sort of T * k_max keys. mark_full=False leaves chunk_full_BGC all
  zero (every chunk masked) and skips computing it: for kernels that do not skip masks.
  pad_rows (a multiple of block_rows; default block_rows): each block's run is padded to a
  multiple of it, so that runs of pad_rows rows also read one block each (the Hopper
  persistent forward's 128-row work items); chunks of padding only are unused (-1).
  tile_ranks: the ranks by tile_read_ranks' kernel (interpret: in interpret mode, on CPU),
  else by _read_ranks' running count (XLA only); the same layout either way.
  """
  sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
  b, g, t, kmax = sel_BGTK.shape
  n, gh, r = num_blocks, group_size, block_rows
  if n < 1 or t % n:
    raise ValueError(f"num_blocks={n} must divide the selection's T={t}")
  if gh < 1 or r < 1:
    raise ValueError(f"group_size={gh} (query heads per KV head) and block_rows={r} must be "
                     ">= 1")
  if segment_ids_BT.shape != (b, t):
    raise ValueError(f"segment_ids_BT must be [B={b}, T={t}] as the selection, got "
                     f"{segment_ids_BT.shape}")
  pad = r if pad_rows is None else pad_rows
  if pad % r:
    raise ValueError(f"pad_rows={pad} must be a multiple of block_rows={r}")
  cap_rows = -(-(t * kmax * gh + n * (pad - 1)) // pad) * pad
  if tile_ranks:
    rank_BGTK, cnt_BGN = tile_read_ranks(sel.selected_BTGK, n, block_size=t // n,
                                         interpret=interpret)
  else:
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
