"""The dk/dv kernel on key-tile work items (DKV_TILE keys of one KV block, over the block's
run in chunk steps of 64 or 128 sorted rows): the item plan (longest first; runs longer than
a CTA's share split into parts summed afterwards), the kernel and its entry moba_dkv.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.moba import kv_layout
from pallas_kernels.moba.hopper.common import (_await_last_frees, _check_layout, check_supported,
                                               _consumer_setup, DKV_TILE, _grid, ITEM_ROWS,
                                               _mma_turn, _per_row, _persistent_call, _ROWS,
                                               _slots, _smem_transforms, _sorted, sorted_rows,
                                               _trips, _turns)
from pallas_kernels.moba.kernels import _LOG2E, MobaBlockSizes, keys_before_tile


def _dkv_kernel(tile_ref, part_ref, num_ref, first_ref, end_ref, whole_ref, seg_ref, pos_ref,
                lse2_ref, delta_ref, qs_ref, dos_ref, k_ref, v_ref, kseg_ref, dk_ref, dv_ref,
                dk_hi_ref, dk_lo_ref, dv_hi_ref, dv_lo_ref, scoped, *, sm_scale, tiles_per_row,
                tiles_per_block, num_groups, grid, stages, split, p_in_smem, chunk):
  """dk/dv per key tile of DKV_TILE keys: each compute warpgroup holds dK, dV of its 64 keys in
  registers over the `chunk`-row chunks (64 or 128) of the tile's block (q and dO rows already
  in sorted order, so each chunk is one TMA box), computing S^T = K q^T and dP^T = V dO^T, then
  dV += P^T dO and dK += dS^T q with P^T and dS^T from registers; the two warpgroups share each
  chunk (with pingpong taking turns on the tensor cores). A producer warpgroup streams the
  tiles' K/V (two buffers, so the next tile's load overlaps this one's chunks) and the chunks
  (`stages` slots: q, dO and the rows' lse, delta, segment and position). dK and dV leave
  through the warpgroup's half of the K/V buffer. Persistent: CTA c runs items c, c + grid, ...
  below num_ref[0] (ordered by decreasing work outside, dkv_items). An item is a key tile
  (tile_ref, flat over [B, G, tiles]) over the chunks [first_ref[., 0], end_ref) of its
  block's run (without ping-pong, compute warpgroup w computes those from first_ref[., w]:
  the own-block rows before its keys lead the run):
  the whole run, written to dk/dv, or (with `split`) one part of a long run (part_ref >= 0),
  whose dK and dV leave as bf16 hi/lo pairs (x = hi + lo to 2^-16 of x) in that slot of
  dk_hi/dk_lo/dv_hi/dv_lo for the caller to sum. A chunk skips the mask for the key tiles it
  attends whole (whole_ref [B, G, C]: the first that many tiles of its block)."""
  q_smem, do_smem, rowf_smem, rowi_smem, k_smem, v_smem, p_smem, bars = scoped
  kv_bar, kv_free, chunk_bar, chunk_free, turn = bars
  frees = _slots(kv_free, 2) + _slots(chunk_free, stages)
  wg = lax.axis_index("wg")
  cta = lax.axis_index("cta")
  trips = _trips(num_ref[0], grid)
  # Registers per thread (producer, compute; the CTA's pool is 168 x 384). Below head_dim 128
  # the producer keeps 24 and the compute warpgroups take 240 (ptxas' spills 68 -> 8 bytes,
  # dk/dv 1% faster at 14/2 x 64 on the H200); at 128 that split was 3.3% slower (the
  # producer's q and dO copies then share one set of uniform registers), so there they keep
  # 40 and 232 (BENCHMARKS.md).
  d = k_smem.shape[-1]
  producer_regs, compute_regs = (40, 232) if d >= 128 else (24, 240)

  def item_at(s):
    i = cta + s * grid
    flat = tile_ref[i]
    bg = lax.div(flat, tiles_per_row)
    return (lax.div(bg, num_groups), lax.rem(bg, num_groups), lax.rem(flat, tiles_per_row),
            first_ref[i, 0], end_ref[i])

  def own_first(s, first):
    """The first chunk step this compute warpgroup computes of item s: its half's (the steps
    before hold only own-block rows before its 64 keys, all masked), or with ping-pong, as
    both take equally many turns, the item's."""
    return first if turn is not None else first_ref[cta + s * grid, wg]

  @pl.when(wg == 2)
  def _producer():
    plgpu.set_max_registers(producer_regs, action="decrease")

    def item_body(s, cstep):
      b, g, n, first, end = item_at(s)
      buf = lax.rem(s, 2)
      keys = (b, pl.ds(n * DKV_TILE, DKV_TILE), g)
      with jax.named_scope("wait_kv_free"):
        plgpu.barrier_wait(kv_free.at[buf])
      plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[buf], kv_bar.at[buf])
      plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[buf], kv_bar.at[buf])

      def chunk_body(c, cstep):
        slot = lax.rem(cstep, stages)
        rows = (b, g, pl.ds(c * chunk, chunk))
        with jax.named_scope("wait_chunk_free"):
          plgpu.barrier_wait(chunk_free.at[slot])
        for src, dst in ((qs_ref, q_smem.at[slot]), (dos_ref, do_smem.at[slot]),
                         (lse2_ref, rowf_smem.at[slot, 0]), (delta_ref, rowf_smem.at[slot, 1]),
                         (seg_ref, rowi_smem.at[slot, 0]), (pos_ref, rowi_smem.at[slot, 1])):
          plgpu.copy_gmem_to_smem(src.at[rows], dst, chunk_bar.at[slot])
        return cstep + 1

      return lax.fori_loop(first, end, chunk_body, cstep)

    lax.fori_loop(0, trips, item_body, jnp.int32(0))
    _await_last_frees(frees)

  @pl.when(wg < 2)
  def _consumer():
    _consumer_setup(frees, compute_regs)
    wait_turn, end_turn, finish = _turns(turn)
    shape = (_ROWS, chunk)  # (this warpgroup's keys, a chunk's rows)
    mine = pl.ds(wg * _ROWS, _ROWS)
    wg_p = p_smem.at[wg] if p_in_smem else None
    col_layout = plgpu.Layout.WGMMA.reduce(0)
    cols = lambda ref: lax.broadcast_in_dim(plgpu.load(ref, layout=col_layout, optimized=False),
                                            shape, [1])

    def item_body(s, cstep):
      b, g, n, first, end = item_at(s)
      buf = lax.rem(s, 2)
      kstart = n * DKV_TILE + wg * _ROWS
      kseg_KR = _per_row(kseg_ref.at[b, pl.ds(kstart, _ROWS)], shape)
      kpos_KR = kstart + plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
      k_w, v_w = k_smem.at[buf, mine], v_smem.at[buf, mine]
      with jax.named_scope("wait_kv"):
        plgpu.barrier_wait(kv_bar.at[buf])

      def chunk_body(c, carry):
        dk, dv, cstep = carry
        slot = lax.rem(cstep, stages)
        whole = lax.rem(n, tiles_per_block) < whole_ref[b, g, c]  # loaded under the waits
        with jax.named_scope("wait_chunk"):
          plgpu.barrier_wait(chunk_bar.at[slot])
        q_t, do_t = q_smem.at[slot], do_smem.at[slot]

        def products(s_ref, dp_ref):
          with jax.named_scope("turn"):
            wait_turn()
          plgpu.wgmma(s_ref, k_w, q_t.transpose((1, 0)))
          plgpu.wgmma(dp_ref, v_w, do_t.transpose((1, 0)))
          end_turn()
          with jax.named_scope("products_wait"):
            return s_ref[...], dp_ref[...]

        s_KR, dp_KR = pl.run_scoped(products, plgpu.ACC(shape, jnp.float32),
                                    plgpu.ACC(shape, jnp.float32))
        with jax.named_scope("ds"):
          p_KR = jnp.exp2(s_KR * (sm_scale * _LOG2E) - cols(rowf_smem.at[slot, 0]))

          def masked(p_KR):
            seg_KR = cols(rowi_smem.at[slot, 0])
            keep = ((seg_KR == kseg_KR) & (seg_KR != 0)
                    & (kpos_KR <= cols(rowi_smem.at[slot, 1])))
            return jnp.where(keep, p_KR, 0.0)

          p_KR = lax.cond(whole, lambda p_KR: p_KR, masked, p_KR)
          ds_KR = p_KR * (dp_KR - cols(rowf_smem.at[slot, 1]))
          p16, ds16 = p_KR.astype(q_t.dtype), ds_KR.astype(q_t.dtype)
          dk, dv, p16, ds16 = lax.optimization_barrier((dk, dv, p16, ds16))
        dv, dk = _mma_turn((wait_turn, end_turn), (dv, dk), [(p16, do_t), (ds16, q_t)], wg_p,
                           "dkdv_mma")
        plgpu.barrier_arrive(chunk_free.at[slot])
        return dk, dv, cstep + 1

      def pass_chunk(_, cstep):
        """A chunk step of the item this warpgroup's keys need not: waited for (its view of
        the barrier's phase) and freed unread."""
        slot = lax.rem(cstep, stages)
        with jax.named_scope("wait_chunk"):
          plgpu.barrier_wait(chunk_bar.at[slot])
        plgpu.barrier_arrive(chunk_free.at[slot])
        return cstep + 1

      zeros = plgpu.layout_cast(jnp.zeros((_ROWS, d), jnp.float32), plgpu.Layout.WGMMA)
      start = own_first(s, first)
      cstep = lax.fori_loop(first, start, pass_chunk, cstep)
      dk, dv, cstep = lax.fori_loop(start, end, chunk_body, (zeros, zeros, cstep))
      dk = dk * sm_scale
      with jax.named_scope("epilogue"):
        # This warpgroup's half of the buffer is no longer read: dK and dV leave through it.
        def store(dk16, dv16, dk_dst, dv_dst):
          k_w[...] = dk16
          v_w[...] = dv16
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(k_w, dk_dst)
          plgpu.copy_smem_to_gmem(v_w, dv_dst)
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        def whole():
          store(dk.astype(k_w.dtype), dv.astype(v_w.dtype),
                dk_ref.at[b, pl.ds(kstart, _ROWS), g], dv_ref.at[b, pl.ds(kstart, _ROWS), g])

        def part_of_run(part):
          mine_part = (part, pl.ds(wg * _ROWS, _ROWS))
          dk_hi, dv_hi = dk.astype(k_w.dtype), dv.astype(v_w.dtype)
          store(dk_hi, dv_hi, dk_hi_ref.at[mine_part], dv_hi_ref.at[mine_part])
          store((dk - dk_hi.astype(jnp.float32)).astype(k_w.dtype),
                (dv - dv_hi.astype(jnp.float32)).astype(v_w.dtype),
                dk_lo_ref.at[mine_part], dv_lo_ref.at[mine_part])

        if split:
          part = part_ref[cta + s * grid]
          pl.when(part < 0)(whole)
          pl.when(part >= 0)(lambda: part_of_run(jnp.maximum(part, 0)))
        else:
          whole()
      plgpu.barrier_arrive(kv_free.at[buf])
      return cstep

    lax.fori_loop(0, trips, item_body, jnp.int32(0))
    finish()
    plgpu.wait_smem_to_gmem(0)


# Up to this many items, longest_first ranks them by comparisons (I^2 of them, one fused
# reduction) instead of a sort: XLA's sort of 4,096 keys took 0.030 ms on the H200.
_RANK_BY_COMPARISON_MAX = 8192


class DkvItems(NamedTuple):
  """dk/dv work items in the order the persistent CTAs deal them (longest first; item i of
  the first num_1[0] goes to CTA i % grid), and the partial-result slots of split tiles."""
  tile_I: jax.Array      # key tile, flat over [B, G, tiles]
  first_I: jax.Array     # the item's chunk steps of its block's run: [first, end)
  end_I: jax.Array
  part_I: jax.Array      # -1: the tile's whole run (written to dk/dv); else its slot
  num_1: jax.Array       # [1] items in use
  part_tile_P: jax.Array   # per slot: its tile, -1 if unused
  part_lead_P: jax.Array   # per slot: the first slot of its tile


# At most this many split items per persistent CTA: a tile splits when its run has more
# chunks than the per-item share total_chunks / (this * grid), so no item holds more than
# that share and the split items' slots have a static bound (twice this * grid).
_DKV_SPLITS_PER_CTA = 1
# In 64-row chunks: shorter parts would pay a tile's K/V load and epilogue for little.
_DKV_MIN_SPLIT_CHUNKS = 8


def dkv_items(first_T, end_T, grid: int, *, split: bool = True,
              min_chunks: int = _DKV_MIN_SPLIT_CHUNKS) -> DkvItems:
  """The dk/dv work items for tiles whose runs cover chunks [first_T, end_T) (moba_dkv's
  chunk steps): one item per tile, except (with split) that a tile whose run is longer than
  the per-item share m (total chunks / (_DKV_SPLITS_PER_CTA * grid), at least min_chunks) is
  split into ceil(len / m) parts of m chunks, each written to its own slot and summed by
  _add_parts.
  Without splits a gate that sends most tokens to a few blocks leaves one CTA a whole long
  run while the others idle. split=False: one item per tile and one slot, never used."""
  len_T = jnp.maximum(end_T - first_T, 0)
  num_tiles = len_T.shape[0]
  if not split:
    none = jnp.full((1,), -1, jnp.int32)
    order = longest_first(end_T - first_T)
    return DkvItems(tile_I=order, first_I=first_T[order], end_I=end_T[order],
                    part_I=jnp.full((num_tiles,), -1, jnp.int32),
                    num_1=jnp.full((1,), num_tiles, jnp.int32), part_tile_P=none,
                    part_lead_P=jnp.ones((1,), jnp.int32))
  cap = _DKV_SPLITS_PER_CTA * grid
  m = jnp.maximum(-(-len_T.sum() // cap), min_chunks)
  parts_T = jnp.where(len_T > m, -(-len_T // m), 0)  # 0: not split
  # Split tiles have len > m, so ceil(len / m) < 2 len / m: at most 2 * cap slots.
  num_parts = 2 * cap
  slot_end_T = jnp.cumsum(parts_T).astype(jnp.int32)
  slot_start_T = slot_end_T - parts_T
  slot_P = jnp.arange(num_parts, dtype=jnp.int32)
  # compare_all, not the default scan: the scan is a while loop, whose condition XLA's GPU
  # runtime reads back to the host each trip, leaving the GPU idle meanwhile.
  tile_P = jnp.searchsorted(slot_end_T, slot_P, side="right",
                            method="compare_all").astype(jnp.int32)
  used_P = slot_P < slot_end_T[-1]
  tile_P = jnp.where(used_P, tile_P, 0)
  j_P = slot_P - slot_start_T[tile_P]  # the part's index within its tile
  # Items: each tile's whole run or first part, then the later parts (slots with j >= 1).
  first_part_T = jnp.where(parts_T > 0, jnp.minimum(first_T + m, end_T), end_T)
  later_P = used_P & (j_P >= 1)
  item_tile = jnp.concatenate([jnp.arange(num_tiles, dtype=jnp.int32), tile_P])
  item_first = jnp.concatenate([first_T, first_T[tile_P] + j_P * m]).astype(jnp.int32)
  item_end = jnp.concatenate([first_part_T, jnp.minimum(first_T[tile_P] + (j_P + 1) * m,
                                                        end_T[tile_P])]).astype(jnp.int32)
  item_part = jnp.concatenate([jnp.where(parts_T > 0, slot_start_T, -1),
                               jnp.where(later_P, slot_P, -1)]).astype(jnp.int32)
  length = jnp.concatenate([first_part_T - first_T,
                            jnp.where(later_P, item_end[num_tiles:] - item_first[num_tiles:],
                                      -1)])
  order = longest_first(length)  # unused slots (length -1) last
  return DkvItems(tile_I=item_tile[order], first_I=item_first[order], end_I=item_end[order],
                  part_I=item_part[order],
                  num_1=(num_tiles + later_P.sum(dtype=jnp.int32))[None],
                  part_tile_P=jnp.where(used_P, tile_P, -1),
                  part_lead_P=jnp.where(used_P, slot_start_T[tile_P], num_parts))


def _add_parts(x_BTKD, hi_PKD, lo_PKD, items: DkvItems, *, num_groups: int):
  """x with each split tile's rows set to the sum of its parts (hi + lo, in float32, rounded
  once to x's dtype); the rows of tiles not split are x's."""
  b, t, hkv, d = x_BTKD.shape
  num_parts = hi_PKD.shape[0]
  parts = hi_PKD.astype(jnp.float32) + lo_PKD.astype(jnp.float32)
  used = (items.part_tile_P >= 0)[:, None, None]
  sums = jax.ops.segment_sum(jnp.where(used, parts, 0.0), items.part_lead_P,
                             num_segments=num_parts)  # at each tile's first slot
  lead = (items.part_lead_P == jnp.arange(num_parts)) & (items.part_tile_P >= 0)
  flat = jnp.where(lead, items.part_tile_P, b * num_groups * (t // DKV_TILE))  # else dropped
  tiles_per_row = t // DKV_TILE
  bg, n = flat // tiles_per_row, flat % tiles_per_row
  x = x_BTKD.reshape(b, tiles_per_row, DKV_TILE, hkv, d)
  x = x.at[bg // num_groups, n, :, bg % num_groups].set(sums.astype(x.dtype), mode="drop")
  return x.reshape(b, t, hkv, d)


def longest_first(length_I):
  """int32 [I]: the item indices by decreasing length, ties in index order (a stable
  descending argsort)."""
  num = length_I.shape[0]
  if num > _RANK_BY_COMPARISON_MAX:
    return jnp.argsort(-length_I, stable=True).astype(jnp.int32)
  idx_I = jnp.arange(num, dtype=jnp.int32)
  ahead_II = ((length_I[None, :] > length_I[:, None])
              | ((length_I[None, :] == length_I[:, None]) & (idx_I[None, :] < idx_I[:, None])))
  rank_I = ahead_II.sum(axis=1, dtype=jnp.int32)
  return jnp.zeros((num,), jnp.int32).at[rank_I].set(idx_I, unique_indices=True)


def dkv_chunk_rows(d: int, chunk_rows: int | None = None) -> int:
  """moba_dkv's sorted rows per chunk step at head_dim d (its docstring says why)."""
  chunk = (ITEM_ROWS if d < 128 else _ROWS) if chunk_rows is None else chunk_rows
  if chunk not in (_ROWS, ITEM_ROWS):
    raise ValueError(f"chunk_rows must be {_ROWS} or {ITEM_ROWS}, got {chunk_rows}")
  return chunk


def dkv_chunk_steps(layout, segment_ids_BT, *, block_size: int, chunk: int, group_heads: int):
  """(first [B, G, n, 2], end [B, G, n]): per key tile n of DKV_TILE keys, the chunk steps
  (`chunk` sorted rows each) of its block's run that each 64-key half (a compute warpgroup's
  keys) computes - from its first to the run's end. A half's first skips the chunk steps that
  hold only own-block rows before its keys (in whole chunk steps: a step's rows before the
  keys are masked out); the tile's first is its first half's. Runs are padded to ITEM_ROWS
  rows, so every run is whole chunk steps."""
  b = segment_ids_BT.shape[0]
  skip_B1nW = keys_before_tile(segment_ids_BT, block_size=block_size, tile=_ROWS).reshape(
      b, 1, -1, DKV_TILE // _ROWS)
  chunks_BGn2 = jnp.repeat(layout.block_chunks_BGN2, block_size // DKV_TILE, axis=2)
  first_BGnW = (chunks_BGn2[..., :1] * _ROWS + skip_B1nW * group_heads) // chunk
  return first_BGnW, chunks_BGn2[..., 1] // (chunk // _ROWS)


def moba_dkv(q_BSD, do_BSD, lse_BS, delta_BS, layout, k_BTKD, v_BTKD, segment_ids_BT, *,
             block_size, bs: MobaBlockSizes, interpret: bool | plgpu.InterpretGPUParams,
             stages: int = 2, num_ctas: int | None = None, q_rows=None, do_rows=None,
             pingpong: bool = False, chunk_rows: int | None = None):
  """dk, dv [B, T, Hkv, D] in k's dtype, as kernels.moba_dkv, on a layout padded with
  pad_rows=ITEM_ROWS (block_size a multiple of DKV_TILE). q and dO are first gathered into
  sorted order (gather_rows), so that every chunk the kernel reads is one box; q_rows /
  do_rows: their rows already in that order (as moba_dq_rows). pingpong: as
  moba_forward_rows' (off by default: at head_dim 128 1.196 ms against 1.257 with it at 16/16
  heads; at 14/2 x 64 on 128-row chunk steps 0.832 against 0.884, two processes each, where
  on 64-row steps it had won by 0.7%: BENCHMARKS.md). chunk_rows: sorted rows per chunk
  step, 64 or 128 (None: 128 below head_dim 128, 0.885 ms against 0.976 at 14/2 x 64,
  top-3, whose 64 x 64 x 64 products are too short to keep the tensor cores fed; 64 at 128,
  where 128 rows' K/V and chunk buffers exceed shared memory)."""
  _check_layout(layout, block_size, 64)
  q_rows = _sorted(q_BSD, q_rows, layout, interpret, "q")
  do_rows = _sorted(do_BSD, do_rows, layout, interpret, "do")
  g = layout.row_src_BGL.shape[1]
  d = q_rows.shape[-1]
  s = lse_BS.shape[1]
  t = k_BTKD.shape[1]
  check_supported(q_rows.dtype, d, bs, block_size)
  chunk = dkv_chunk_rows(d, chunk_rows)
  per = chunk // _ROWS  # the layout's 64-row chunks per chunk step
  first_BGnW, end_BGn = dkv_chunk_steps(layout, segment_ids_BT, block_size=block_size,
                                        chunk=chunk, group_heads=s // t // g)
  first = first_BGnW[..., 0].reshape(-1).astype(jnp.int32)
  end = end_BGn.reshape(-1).astype(jnp.int32)
  num_ctas = _grid(num_ctas, interpret)
  split = bs.fit(block_size, d).split_dkv_runs
  items = dkv_items(first, end, num_ctas, split=split,
                    min_chunks=max(1, _DKV_MIN_SPLIT_CHUNKS // per))
  # Per item, each half's first chunk step (a part of a split run starts where it starts).
  halves_first = first_BGnW.reshape(-1, DKV_TILE // _ROWS)[items.tile_I]
  first_IW = jnp.clip(halves_first, items.first_I[:, None], items.end_I[:, None])
  num_parts = items.part_tile_P.shape[0]
  dt = q_rows.dtype
  transforms = _smem_transforms(dt)
  kernel = functools.partial(_dkv_kernel, sm_scale=1.0 / math.sqrt(d),
                             tiles_per_row=t // DKV_TILE, tiles_per_block=block_size // DKV_TILE,
                             num_groups=g, grid=num_ctas, stages=stages, split=split,
                             p_in_smem=bool(interpret), chunk=chunk)

  def entry(*refs):
    scratch = [plgpu.SMEM((stages, chunk, d), dt, transforms=transforms),
               plgpu.SMEM((stages, chunk, d), dt, transforms=transforms),
               plgpu.SMEM((stages, 2, chunk), jnp.float32),
               plgpu.SMEM((stages, 2, chunk), jnp.int32),
               plgpu.SMEM((2, DKV_TILE, d), dt, transforms=transforms),
               plgpu.SMEM((2, DKV_TILE, d), dt, transforms=transforms),
               plgpu.SMEM((2, _ROWS, chunk), dt, transforms=transforms) if interpret else None]
    bars = (plgpu.Barrier(num_arrivals=2, num_barriers=2),
            plgpu.Barrier(num_arrivals=2, num_barriers=2),
            plgpu.Barrier(num_arrivals=6, num_barriers=stages),
            plgpu.Barrier(num_arrivals=2, num_barriers=stages),
            # the compute warpgroups' turns (_turns)
            plgpu.Barrier(num_barriers=2) if pingpong else None)
    pl.run_scoped(lambda *scoped: kernel(*refs, scoped), *scratch, bars, collective_axes="wg")

  part = jax.ShapeDtypeStruct((num_parts, DKV_TILE, d), dt)
  call = _persistent_call(entry, [jax.ShapeDtypeStruct(k_BTKD.shape, k_BTKD.dtype),
                                  jax.ShapeDtypeStruct(v_BTKD.shape, v_BTKD.dtype)] + [part] * 4,
                          name="moba_dkv_hopper", num_ctas=num_ctas, warpgroups=3,
                          interpret=interpret)
  blk_BGC = layout.chunk_block_BGC
  blk_BGC = blk_BGC.reshape(*blk_BGC.shape[:2], -1, per)[..., 0]  # a step's chunks share it
  whole = kv_layout.attended_key_tiles(blk_BGC, layout.row_seg_BGL, layout.row_pos_BGL,
                                       segment_ids_BT, num_blocks=t // block_size,
                                       block_rows=chunk, tile=DKV_TILE)
  dk, dv, dk_hi, dk_lo, dv_hi, dv_lo = call(
      items.tile_I, items.part_I, items.num_1, first_IW.astype(jnp.int32), items.end_I, whole,
      layout.row_seg_BGL, layout.row_pos_BGL, sorted_rows(lse_BS * _LOG2E, layout),
      sorted_rows(delta_BS, layout), q_rows, do_rows.astype(dt),
      k_BTKD, v_BTKD, segment_ids_BT.astype(jnp.int32))
  if not split:
    return dk, dv
  return (_add_parts(dk, dk_hi, dk_lo, items, num_groups=g),
          _add_parts(dv, dv_hi, dv_lo, items, num_groups=g))
