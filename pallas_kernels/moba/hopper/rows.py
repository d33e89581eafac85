"""The forward and dq kernels on row work items (ITEM_ROWS sorted rows that read one KV
block): the item list, the two streaming warpgroups (K/V tiles; the items' query rows), the
row take, the two kernels and their entries moba_forward_rows and moba_dq_rows.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.moba import gating
from pallas_kernels.moba.hopper.common import (_accumulate, _await_last_frees, _check_layout,
                                               _check_operands, _consumer_setup, _grid, ITEM_ROWS,
                                               _mma_turn, _per_row, _persistent_call, _ROWS, _slots,
                                               _smem_transforms, _sorted, sorted_rows, _trips,
                                               _turns)
from pallas_kernels.moba.kernels import _LOG2E, _MASK, MobaBlockSizes

_IDS_AHEAD = 8  # row ids the gatherer reads ahead of their copies (registers: it keeps 24)


def persistent_items(layout, segment_ids_BT, *, block_size: int, block_kv: int):
  """Work items of the forward: every ITEM_ROWS-row run of a (row, KV group)'s
  sorted rows (the layout padded with pad_rows=ITEM_ROWS, so each reads one block).

  Returns int32 arrays: the used items' flat ids (b * G + g) * I + i, used ones first, and
  their count [1]; per flat id its block, its key steps (own-block items stop after their
  last query's tile) and how many of them come first unmasked (every (row, key) pair
  attended; gating.attended_key_tiles, padding rows ignored: their outputs are never read)."""
  b, g, l = layout.row_pos_BGL.shape
  items = l // ITEM_ROWS
  per_item = layout.chunk_block_BGC.shape[-1] // items
  blk_BGI = layout.chunk_block_BGC.reshape(b, g, items, per_item)[..., 0]
  blk = blk_BGI.reshape(-1)
  pos = jnp.where(layout.row_seg_BGL != 0, layout.row_pos_BGL, 0).reshape(-1, ITEM_ROWS)
  last = pos.max(-1) - jnp.maximum(blk, 0) * block_size
  steps = jnp.clip(last // block_kv + 1, 1, block_size // block_kv).astype(jnp.int32)
  unmasked = gating.attended_key_tiles(
      blk_BGI, layout.row_seg_BGL, layout.row_pos_BGL, segment_ids_BT,
      num_blocks=segment_ids_BT.shape[1] // block_size, block_rows=ITEM_ROWS, tile=block_kv,
      ignore_padding_rows=True).reshape(-1)
  used = blk >= 0
  ids = jnp.nonzero(used, size=used.size, fill_value=0)[0].astype(jnp.int32)
  return ids, used.sum(dtype=jnp.int32)[None], blk.astype(jnp.int32), steps, unmasked


def box_halves(layout, num_heads: int):
  """int32 [B * G * I], per work item (persistent_items' flat ids): bit w set where the item's
  half w (64 sorted rows) reads 64 consecutive tokens of one query head, rows s0, s0 + Hq, ...
  of q viewed [B, T * Hq, D]: one strided box of q viewed [B, T, Hq, D] brings them, where
  64 single-row copies would. With one query head per KV group a block's own tokens, which
  lead its run in order, make such halves; with more the rows of a token's heads interleave
  and no half is one."""
  src = layout.row_src_BGL
  b, g, l = src.shape
  halves = src.reshape(b, g, l // _ROWS, _ROWS)
  stride = num_heads * jnp.arange(_ROWS, dtype=src.dtype)
  whole = jnp.all(halves == halves[..., :1] + stride, axis=-1).reshape(b, g, -1, 2)
  return (whole[..., 0].astype(jnp.int32) | (whole[..., 1].astype(jnp.int32) << 1)).reshape(-1)


def _half_is_box(box, half):
  """In a kernel: whether box_halves' bits `box` mark half `half` (0 or 1, may be traced)."""
  return lax.rem(lax.shift_right_logical(box, jnp.asarray(half, jnp.int32)), 2) == 1


def _half_rows(i, half):
  """Item i's half `half` (a compute warpgroup's 64 rows) in its group's sorted rows."""
  return pl.ds(i * ITEM_ROWS + half * _ROWS, _ROWS)


def _half_plans(group_heads: int) -> list[list[tuple[int, int]]]:
  """How the gatherer copies one 64-row half of an item row by row, per gathered operand:
  plans[lead] lists (first row in the half, rows) per copy for a half whose first whole token
  starts at row `lead`. The layout keeps a token's group_heads query heads (which share its
  block picks) in consecutive sorted rows, from the start of each block's run, and they are
  consecutive rows of q viewed [B, T * Hq, D] too, so one box can bring a token's rows. A half
  may start and end inside a token (runs start on multiples of 128 rows, not of
  group_heads), so a plan copies the rows before its first whole token one by one, its whole
  tokens a box each, the rows after its last one by one; which plan a half takes follows from
  its first row's head (q's row src holds head src mod group_heads of its group). Padding
  rows (row id 0) take the same copies, so they hold rows of q, not necessarily row 0. Where
  no plan is shorter than 64 copies (one head per group, or very many), one plan of a copy per
  row."""
  gh = group_heads
  plans = []
  for lead in range(gh):
    whole = (_ROWS - lead) // gh
    tail = lead + whole * gh
    plans.append([(r, 1) for r in range(lead)] + [(lead + k * gh, gh) for k in range(whole)]
                 + [(r, 1) for r in range(tail, _ROWS)])
  if gh == 1 or max(map(len, plans)) >= _ROWS:
    return [[(r, 1) for r in range(_ROWS)]]
  return plans


def _half_arrivals(group_heads: int) -> int:
  """The rows barrier's arrivals per gathered half and operand: the longest plan's copies (a
  shorter plan arrives for the rest without a copy)."""
  return max(map(len, _half_plans(group_heads)))


def _item_reader(ids_ref, blk_ref, steps_ref, unmasked_ref, box_ref, *, grid, num_groups,
                 items_per_group):
  """Returns item_at(s): (b, g, i, block, key steps, unmasked steps, box halves) of this
  CTA's s-th item (cta + s * grid), and item_loop(trips, body, init): the loop over the CTA's
  items, carry = body(s, item_at(s), carry), with each item's fields loaded one item ahead and
  its id two ahead, so that these global loads (a dependent pair) wait behind an item's work
  instead of in front of the next one."""
  cta = lax.axis_index("cta")
  flat_at = lambda s: ids_ref[jnp.minimum(cta + s * grid, ids_ref.shape[0] - 1)]

  def fields(flat):
    i = lax.rem(flat, items_per_group)
    bg = lax.div(flat, items_per_group)
    return (lax.div(bg, num_groups), lax.rem(bg, num_groups), i, blk_ref[flat],
            steps_ref[flat], unmasked_ref[flat], box_ref[flat])

  def item_loop(trips, body, init):
    def step(s, carry):
      flat_next, item, c = carry
      flat_after = flat_at(s + 2)
      item_next = fields(flat_next)
      return flat_after, item_next, body(s, item, c)

    return lax.fori_loop(0, trips, step, (flat_at(1), fields(flat_at(0)), init))[2]

  return (lambda s: fields(flat_at(s))), item_loop


def _streams(item_at, item_loop, trips, src_ref, gathered, views, row_refs, k_ref, v_ref,
             kseg_ref, scoped, *, block_size, block_kv, k_stages, v_stages, presorted,
             group_heads):
  """The two streaming warpgroups, shared by the forward and dq kernels.

  Warpgroup 2 streams each item's K and V tiles into k_stages and v_stages slots by TMA,
  straight on from one item into the next, with the tile's key segment ids (the mask's, read
  from shared memory instead of global memory in the compute warpgroups' critical path).
  Warpgroup 3 copies each half's rows' segment and position (`row_refs`, [B, G, L] in sorted
  order) into scoped.rowi, and gathers each item's rows of every ref in `gathered` into its
  staging buffer: TMA copies boxes and the wgmma operand layout (8-row swizzled tiles) takes no
  single-row copies, so the item's row ids come first (one copy into shared memory, the next
  item's while this one computes), then one copy per row (per token's query heads of the KV
  group, _half_plans) into a plain buffer, which the compute warpgroups move into their
  swizzled tiles. Up to 128 copies per item and ref, issued by one thread, would hold up the
  K/V stream if one warpgroup issued both.
  presorted: per ref of `gathered`, whether it already holds the rows in sorted order
  ([B, G, L, D]): then each half is one box copy, straight into the item's swizzled tile
  (scoped.tiles[n][s % 2]: two per warpgroup, by item parity, with no staging and no move;
  the gatherer refills the one of item s once bars.tile_free[s % 2] says that item s - 2's
  output, which leaves through the first operand's tile, has been read out), and with every
  ref so no row ids are read. views: per ref of `gathered`, the same array viewed
  [B, T, Hq, D]: a half whose rows are 64 consecutive tokens of one head (the item's
  box_halves bit) comes from it in one strided box, every operand's part and the rows'
  segment and position then arriving on bars.box instead of bars.rows (_take_rows waits on
  the one the item's bit names). group_heads: query heads per KV group (_half_plans)."""
  idx_smem, stage_smems, k_smem, v_smem = scoped.idx, scoped.stages, scoped.k, scoped.v
  bars = scoped.bars
  tile_frees = _tile_frees(bars)

  def wait_frees(s):
    """Before item s's copies: the staging buffers (and rowi) moved out by both halves of
    the last item, and (presorted refs) the item's tiles free again."""
    with jax.named_scope("wait_rows_free"):
      plgpu.barrier_wait(bars.rows_free)
      if tile_frees:
        plgpu.barrier_wait(bars.tile_free.at[lax.rem(s, 2)])
  wg = lax.axis_index("wg")

  @pl.when(wg == 2)
  def _kv_producer():
    plgpu.set_max_registers(24, action="decrease")

    def item_body(s, item, gstep):
      b, g, _, j, n, _, _ = item

      def step_body(step, gstep):
        kslot, vslot = lax.rem(gstep, k_stages), lax.rem(gstep, v_stages)
        keys = (b, pl.ds(j * block_size + step * block_kv, block_kv), g)
        with jax.named_scope("wait_k_free"):
          plgpu.barrier_wait(bars.k_free.at[kslot])
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[kslot], bars.k.at[kslot])
        plgpu.copy_gmem_to_smem(kseg_ref.at[b, keys[1]], scoped.kseg.at[kslot], bars.k.at[kslot])
        with jax.named_scope("wait_v_free"):
          plgpu.barrier_wait(bars.v_free.at[vslot])
        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[vslot], bars.v.at[vslot])
        return gstep + 1

      return lax.fori_loop(0, n, step_body, gstep)

    item_loop(trips, item_body, jnp.int32(0))
    _await_last_frees(_slots(bars.k_free, k_stages) + _slots(bars.v_free, v_stages))

  @pl.when(wg == 3)
  def _row_gatherer():
    plgpu.set_max_registers(24, action="decrease")

    def fetch_ids(s):
      b, g, i, *_ = item_at(s)
      plgpu.copy_gmem_to_smem(src_ref.at[b, g, pl.ds(i * ITEM_ROWS, ITEM_ROWS)],
                              idx_smem, bars.idx)

    def copy_row_values(b, g, i, w, bar):
      for n, ref in enumerate(row_refs):
        plgpu.copy_gmem_to_smem(ref.at[b, g, _half_rows(i, w)], scoped.rowi.at[w, n], bar)

    def copy_presorted(b, g, i, w, buf, bar):
      """Half w of the presorted refs, one box each, straight into item parity buf's tiles."""
      for n, ref in enumerate(gathered):
        if presorted[n]:
          plgpu.copy_gmem_to_smem(ref.at[b, g, _half_rows(i, w)], scoped.tiles[n].at[buf, w],
                                  bar)

    if all(presorted):
      @pl.loop(0, trips)
      def _item(s):
        b, g, i, *_ = item_at(s)
        wait_frees(s)
        for w in range(2):
          copy_row_values(b, g, i, w, bars.rows.at[w])
          copy_presorted(b, g, i, w, lax.rem(s, 2), bars.rows.at[w])

      _await_last_frees([bars.rows_free, *tile_frees])
      return
    pl.when(trips > 0)(lambda: fetch_ids(0))
    plans = _half_plans(group_heads)
    arrivals = _half_arrivals(group_heads)

    def copy_plan(b, w, plan):
      """One half's row copies by `plan` (_half_plans), then the arrivals the longest plan has
      and this one lacks. Row ids are read _IDS_AHEAD at a time before their copies: a copy's
      issue is an asm block no load moves across, so an id read just before its copy would
      put a shared-memory load's latency on every copy's dependent chain."""
      for c0 in range(0, len(plan), _IDS_AHEAD):
        chunk = plan[c0:c0 + _IDS_AHEAD]
        ids = [idx_smem[w * _ROWS + at] for at, _ in chunk]
        for (at, size), row_id in zip(chunk, ids):
          for n, ref in enumerate(gathered):
            if not presorted[n]:
              plgpu.copy_gmem_to_smem(ref.at[b, pl.ds(row_id, size)],
                                      stage_smems[n].at[w, pl.ds(at, size)], bars.rows.at[w])
      for _ in range((arrivals - len(plan)) * sum(not p for p in presorted)):
        plgpu.barrier_arrive(bars.rows.at[w])

    def gather_half(b, g, i, w, buf):
      copy_row_values(b, g, i, w, bars.rows.at[w])
      copy_presorted(b, g, i, w, buf, bars.rows.at[w])
      if len(plans) == 1:
        copy_plan(b, w, plans[0])
        return
      gh = len(plans)
      lead = lax.rem(gh - lax.rem(idx_smem[w * _ROWS], gh), gh)
      for first, plan in enumerate(plans):
        pl.when(lead == first)(functools.partial(copy_plan, b, w, plan))

    def box_half(b, g, i, w, buf):
      copy_row_values(b, g, i, w, bars.box.at[w])
      copy_presorted(b, g, i, w, buf, bars.box.at[w])
      first = idx_smem[w * _ROWS]
      for n, view in enumerate(views):
        if not presorted[n]:
          heads = view.shape[2]
          src = view.at[b, pl.ds(lax.div(first, heads), _ROWS), lax.rem(first, heads)]
          plgpu.copy_gmem_to_smem(src, stage_smems[n].at[w], bars.box.at[w])

    @pl.loop(0, trips)
    def _item(s):
      b, g, i, _, _, _, box = item_at(s)
      with jax.named_scope("wait_rows_free"):
        plgpu.barrier_wait(bars.idx)
      wait_frees(s)
      with jax.named_scope("gather"):
        for w in range(2):
          is_box = _half_is_box(box, w)
          buf = lax.rem(s, 2)
          pl.when(is_box)(lambda: box_half(b, g, i, w, buf))
          pl.when(jnp.logical_not(is_box))(lambda: gather_half(b, g, i, w, buf))
      # The next item's ids arrive while this item computes, once every thread has read
      # this item's (the warpgroup barrier, after a proxy fence, of commit_smem).
      plgpu.commit_smem()
      pl.when(s + 1 < trips)(lambda: fetch_ids(s + 1))

    _await_last_frees([bars.rows_free, *tile_frees])


def _start_streams(item_refs, src_ref, gathered, views, row_refs, k_ref, v_ref, kseg_ref, scoped,
                   *, grid, num_groups, items_per_group, **stream_params):
  """The forward's and dq's common start: this CTA's item count and item reader (item_refs:
  the item list, its count and the per-item fields, as _launch passes them) and the two
  streaming warpgroups (_streams, with stream_params). Returns (trips, item_loop)."""
  ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref = item_refs
  trips = _trips(num_ref[0], grid)
  item_at, item_loop = _item_reader(ids_ref, blk_ref, steps_ref, unmasked_ref, box_ref,
                                    grid=grid, num_groups=num_groups,
                                    items_per_group=items_per_group)
  _streams(item_at, item_loop, trips, src_ref, gathered, views, row_refs, k_ref, v_ref,
           kseg_ref, scoped, **stream_params)
  return trips, item_loop


class _Bars(NamedTuple):
  idx: Any       # row ids of an item landed
  rows: Any      # a half's gathered rows landed (per compute warpgroup)
  box: Any       # a half's rows landed as one box per operand (per compute warpgroup)
  rows_free: Any  # both halves moved out of the staging buffers
  tile_free: Any  # (presorted operands) per item parity: its tiles free for the next refill
  k: Any         # K tile and its key segment ids landed (per slot)
  v: Any         # V tile landed (per slot)
  k_free: Any    # K slot read by both compute warpgroups
  v_free: Any    # V slot read by both compute warpgroups
  turn: Any      # each compute warpgroup's turn on the tensor cores (_turns)


class _Scoped(NamedTuple):
  stages: Any   # per gathered ref: (2, 64, D) plain staging (None: presorted)
  tiles: Any    # per gathered ref: (2, 64, D) swizzled wgmma operand, one per warpgroup
                # (presorted: (2, 2, 64, D), per item parity and warpgroup)
  k: Any        # (k_stages, block_kv, D) swizzled
  v: Any        # (v_stages, block_kv, D) swizzled
  kseg: Any     # (k_stages, block_kv) int32: the K tile's key segment ids
  rowi: Any     # (2, 2, 64) int32: each half's rows' segment and position
  row_out: Any  # forward: (2, 64) float32, the lse on its way out
  idx: Any      # (ITEM_ROWS,) int32 row ids (rows gathered in the kernel)
  p: Any        # interpret mode only: (2, 64, block_kv) swizzled P / dS
  bars: _Bars


def _take_rows(scoped, shape, box):
  """Moves this warpgroup's half of the item's gathered rows from staging into its swizzled
  tiles (presorted operands came straight into theirs) and reads its rows' segment and
  position, returned broadcast to `shape` ([64, block_kv]). A move first waits for the
  stores that read its tiles: every store of this warpgroup where the output leaves through
  a moved tile (the first operand's), else all but the last item's output, which left
  through a tile of its own (_release_tiles frees that one).
  Named regions: take_wait_rows (the rows' arrival, on the barrier the item's box_halves bit
  `box` names), take_wait_store (the stores), take_rows (the move)."""
  wg = lax.axis_index("wg")
  is_box = _half_is_box(box, wg)
  with jax.named_scope("take_wait_rows"):
    pl.when(is_box)(lambda: plgpu.barrier_wait(scoped.bars.box.at[wg]))
    pl.when(jnp.logical_not(is_box))(lambda: plgpu.barrier_wait(scoped.bars.rows.at[wg]))
  moved = [(stage, tile) for stage, tile in zip(scoped.stages, scoped.tiles) if stage is not None]
  if moved:
    with jax.named_scope("take_wait_store"):
      plgpu.wait_smem_to_gmem(0 if scoped.stages[0] is not None else 1, wait_read_only=True)
  with jax.named_scope("take_rows"):
    for stage, tile in moved:
      tile.at[wg][...] = stage.at[wg][...]
    values = [_per_row(scoped.rowi.at[wg, n], shape) for n in range(2)]
    plgpu.commit_smem()
    plgpu.barrier_arrive(scoped.bars.rows_free)
  return values


def _tile_frees(bars):
  """The two tile_free barriers (presorted operands: the tiles of each item parity free for the
  gatherer's refill), or none."""
  return [] if bars.tile_free is None else _slots(bars.tile_free, 2)


def _item_tile(scoped, n, s):
  """This warpgroup's tile of gathered operand n for its item s."""
  tile = scoped.tiles[n]
  wg = lax.axis_index("wg")
  return tile.at[wg] if scoped.stages[n] is not None else tile.at[lax.rem(s, 2), wg]


def _release_tiles(bars, s, pending: int):
  """During item s (> 0; presorted operands), or after the last (s = the item count, pending
  0): once item s - 1's output store, which left through its tiles, has read them, hands
  those tiles back to the gatherer (for item s + 1, or its last wait). pending: the stores
  this warpgroup has issued since, which may stay in flight."""
  def release():
    with jax.named_scope("release_wait_store"):
      plgpu.wait_smem_to_gmem(pending, wait_read_only=True)
    plgpu.barrier_arrive(bars.tile_free.at[lax.rem(s + 1, 2)])

  pl.when(s > 0)(release)


def _masker(seg_RK, pos_RK, kseg_smem):
  """keep(slot, start): [64, block_kv] bool, the pairs of this half's rows and the keys from
  `start` (their segment ids in kseg_smem[slot]) that are attended (same document, not
  padding, causal)."""
  shape = seg_RK.shape

  def keep(slot, start):
    kseg_K = plgpu.load(kseg_smem.at[slot], layout=plgpu.Layout.WGMMA.reduce(0),
                        optimized=False)
    plgpu.commit_smem()  # this read before the slot's next TMA write (another proxy)
    kpos_RK = start + plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
    return ((seg_RK == lax.broadcast_in_dim(kseg_K, shape, [1])) & (seg_RK != 0)
            & (kpos_RK <= pos_RK))

  return keep


def _split_steps(first, unmasked, n, step, carry):
  """Key steps first..n-1 as two loops - those before `unmasked` (attended whole) with
  step(i, carry, masked=False), the rest with masked=True - so that no step branches on its
  mask."""
  split = jnp.clip(unmasked, first, n)
  carry = lax.fori_loop(first, split, functools.partial(step, masked=False), carry)
  return lax.fori_loop(split, n, functools.partial(step, masked=True), carry)


def _fwd_kernel(ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref, src_ref, seg_ref,
                pos_ref, q_ref, k_ref, v_ref, kseg_ref, q_view, o_ref, lse_ref, *refs, sm_scale,
                block_size, block_kv, k_stages, v_stages, num_groups, items_per_group, grid,
                p_in_smem, presorted, group_heads, overlap):
  """Four warpgroups per CTA: two compute warpgroups (64 rows of an item each) and the two
  streams of _streams (K/V tiles; query rows). Each CTA runs items cta, cta + grid, ... of
  the used-item list, so the streams run on across items. The output leaves through the
  q tile. With a third output (refs = (qs_ref, scoped)), each warpgroup also stores its
  gathered q rows there, in sorted order, for the backward kernels."""
  qs_ref, scoped = refs if len(refs) == 2 else (None, *refs)
  bars = scoped.bars
  wg = lax.axis_index("wg")
  trips, item_loop = _start_streams(
      (ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref), src_ref, [q_ref], [q_view],
      [seg_ref, pos_ref], k_ref, v_ref, kseg_ref, scoped, grid=grid, num_groups=num_groups,
      items_per_group=items_per_group, block_size=block_size, block_kv=block_kv,
      k_stages=k_stages, v_stages=v_stages, presorted=presorted, group_heads=group_heads)

  @pl.when(wg < 2)
  def _consumer():
    _consumer_setup([bars.rows_free, *_slots(bars.k_free, k_stages),
                     *_slots(bars.v_free, v_stages)])
    wait_turn, end_turn, finish = _turns(bars.turn)
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    shape = (_ROWS, block_kv)
    q_tile = scoped.tiles[0].at[wg]
    d = q_tile.shape[-1]
    p_smem = scoped.p.at[wg] if p_in_smem else None
    scale = sm_scale * _LOG2E

    def item_body(s, item, gstep):
      b, g, i, j, n, unmasked, box = item
      rows = _half_rows(i, wg)
      keep = _masker(*_take_rows(scoped, shape, box), scoped.kseg)
      if qs_ref is not None:
        plgpu.copy_smem_to_gmem(q_tile, qs_ref.at[b, g, rows])

      def softmax(s_RK, step, slot, m_prev, l_prev, masked=None):
        """Online softmax of one key step: the new row maxima and sums, P (q's dtype) and
        the correction of the output so far. masked: whether the step needs the mask
        (None: decided at run time, step < unmasked)."""
        start = j * block_size + step * block_kv

        def unmasked_p(s_RK):
          # The scale applied to the row maxima, so that p takes one fused multiply-add.
          m_next = jnp.maximum(m_prev, s_RK.max(axis=1) * scale)
          return m_next, jnp.exp2(s_RK * scale - lax.broadcast_in_dim(m_next, shape, [0]))

        def masked_p(s_RK):
          s_RK = jnp.where(keep(slot, start), s_RK * scale, _MASK)
          m_next = jnp.maximum(m_prev, s_RK.max(axis=1))
          return m_next, jnp.exp2(s_RK - lax.broadcast_in_dim(m_next, shape, [0]))

        if masked is None:
          m_next, p = lax.cond(step < unmasked, unmasked_p, masked_p, s_RK)
        else:
          m_next, p = (masked_p if masked else unmasked_p)(s_RK)
        plgpu.barrier_arrive(bars.k_free.at[slot])  # K and its key segments read
        corr = jnp.exp2(m_prev - m_next)
        return m_next, l_prev * corr + p.sum(axis=1), p.astype(q_tile.dtype), corr

      def qk(kslot, pv=None):
        """S = q K^T on K slot kslot, issued in a turn on the tensor cores (with pv =
        (acc_ref, P, V slot): that P V after it, left running), returned once done."""
        def body(s_ref):
          with jax.named_scope("turn"):
            wait_turn()
          plgpu.wgmma(s_ref, q_tile, scoped.k.at[kslot].transpose((1, 0)))
          if pv is not None:
            plgpu.wgmma(pv[0], pv[1], scoped.v.at[pv[2]])
          end_turn()
          with jax.named_scope("qk_wait"):
            return plgpu.wgmma_accumulator_load(s_ref, wait_n=0 if pv is None else 1)

        return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))

      def pv_turn(acc, p16, vslot):
        """acc + P V on V slot vslot in a turn of its own; frees the slot."""
        with jax.named_scope("wait_kv"):
          plgpu.barrier_wait(bars.v.at[vslot])
        (acc,) = _mma_turn((wait_turn, end_turn), (acc,), [(p16, scoped.v.at[vslot])], p_smem,
                           "pv")
        plgpu.barrier_arrive(bars.v_free.at[vslot])
        return acc

      def plain_step(step, carry, *, masked):
        """Key step `step` in two turns: S = q K^T, the softmax, then P V."""
        acc, m_prev, l_prev, gstep = carry
        kslot, vslot = lax.rem(gstep, k_stages), lax.rem(gstep, v_stages)
        with jax.named_scope("wait_kv"):
          plgpu.barrier_wait(bars.k.at[kslot])
        s_RK = qk(kslot)
        with jax.named_scope("softmax"):
          m_next, l_next, p16, corr = softmax(s_RK, step, kslot, m_prev, l_prev, masked)
          acc = acc * lax.broadcast_in_dim(corr, acc.shape, [0])
        return pv_turn(acc, p16, vslot), m_next, l_next, gstep + 1

      def overlapped_step(step, carry, *, first):
        """Key step `step`: S = q K^T of this step and (but in the first) the output's
        P V of the previous one are issued together in one turn on the tensor cores; the
        softmax of S runs while P V does (FlashAttention-3's intra-warpgroup overlap)."""
        acc, m_prev, l_prev, p16_prev, gstep = carry
        slot = lax.rem(gstep, k_stages)
        prev = lax.rem(gstep + v_stages - 1, v_stages)  # the previous step's V
        with jax.named_scope("wait_kv"):
          plgpu.barrier_wait(bars.k.at[slot])
          if not first:
            plgpu.barrier_wait(bars.v.at[prev])
        if first or p_smem is not None:
          # (Interpret mode: P V through shared memory, in order, after S.)
          s_RK = qk(slot)
          if not first:
            acc = _accumulate(acc, p16_prev, scoped.v.at[prev], p_smem)
          with jax.named_scope("softmax"):
            m_next, l_next, p16, corr = softmax(s_RK, step, slot, m_prev, l_prev)
        else:
          def overlapped(refs):
            acc_ref, m_ref, l_ref, p_ref, corr_ref = refs
            s_RK = qk(slot, (acc_ref, p16_prev, prev))
            with jax.named_scope("softmax"):
              outs = softmax(s_RK, step, slot, m_prev, l_prev)
            for ref, out in zip((m_ref, l_ref, p_ref, corr_ref), outs):
              ref[...] = out
            with jax.named_scope("pv_wait"):
              plgpu.wgmma_wait(0)

          acc, m_next, l_next, p16, corr = pl.run_state(overlapped)(
              (plgpu.ACC.init(acc), m_prev, l_prev, p16_prev, m_prev))
        if not first:
          plgpu.barrier_arrive(bars.v_free.at[prev])
        acc = acc * lax.broadcast_in_dim(corr, acc.shape, [0])
        return acc, m_next, l_next, p16, gstep + 1

      init = (plgpu.layout_cast(jnp.zeros((_ROWS, d), jnp.float32), plgpu.Layout.WGMMA),
              plgpu.layout_cast(jnp.full((_ROWS,), _MASK, jnp.float32), row_layout),
              plgpu.layout_cast(jnp.zeros((_ROWS,), jnp.float32), row_layout))
      if overlap:
        p16_0 = plgpu.layout_cast(jnp.zeros(shape, q_tile.dtype), plgpu.Layout.WGMMA)
        carry = overlapped_step(0, (*init, p16_0, gstep), first=True)
        # One loop: split in two (as the plain schedule is), ptxas serializes its wgmma
        # (C7513: registers of P V's operand defined between the loops; BENCHMARKS.md).
        acc, m, l, p16, gstep = lax.fori_loop(
            1, n, functools.partial(overlapped_step, first=False), carry)
        # The last step's P V, in a turn of its own.
        acc = pv_turn(acc, p16, lax.rem(gstep + v_stages - 1, v_stages))
      else:
        acc, m, l, gstep = _split_steps(0, unmasked, n, plain_step, (*init, gstep))
      with jax.named_scope("epilogue"):
        if qs_ref is not None:
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the q rows' store has read the tile
        # One reciprocal per row and a multiply per element (a division is several).
        q_tile[...] = (acc * lax.broadcast_in_dim(1.0 / l, acc.shape, [0])).astype(q_tile.dtype)
        scoped.row_out.at[wg][...] = (m + jnp.log2(l)) / _LOG2E  # natural-log lse
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_tile, o_ref.at[b, g, rows])
        plgpu.copy_smem_to_gmem(scoped.row_out.at[wg], lse_ref.at[b, g, rows])
      return gstep

    item_loop(trips, item_body, jnp.int32(0))
    finish()
    plgpu.wait_smem_to_gmem(0)


def _dq_kernel(ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref, src_ref, seg_ref,
               pos_ref, lse_ref, delta_ref, q_ref, do_ref, k_ref, v_ref, kseg_ref, q_view, do_view,
               dq_ref, *refs, sm_scale, block_size, block_kv, k_stages, v_stages, num_groups,
               items_per_group, grid, p_in_smem, presorted, group_heads, overlap):
  """dq per sorted row, on the forward's structure: the streams gather q and dO rows; each
  compute warpgroup runs S = q K^T and dP = dO V^T, dS = P (dP - delta) with
  P = exp(S - lse), and dq += dS K (dS from registers), with pingpong taking turns on the
  tensor cores with the other. lse and delta come per sorted row. dq leaves through the q
  tile (presorted q: the item's own one of two, so the next item's rows need not wait for
  that store). With a second output (refs = (dos_ref, scoped)), each warpgroup also stores
  its dO rows there, in sorted order, for the dk/dv kernel."""
  dos_ref, scoped = refs if len(refs) == 2 else (None, *refs)
  bars = scoped.bars
  wg = lax.axis_index("wg")
  trips, item_loop = _start_streams(
      (ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref), src_ref, [q_ref, do_ref],
      [q_view, do_view], [seg_ref, pos_ref], k_ref, v_ref, kseg_ref, scoped, grid=grid,
      num_groups=num_groups, items_per_group=items_per_group, block_size=block_size,
      block_kv=block_kv, k_stages=k_stages, v_stages=v_stages, presorted=presorted,
      group_heads=group_heads)

  tile_frees = _tile_frees(bars)

  @pl.when(wg < 2)
  def _consumer():
    _consumer_setup([bars.rows_free, *_slots(bars.k_free, k_stages),
                     *_slots(bars.v_free, v_stages), *tile_frees])
    wait_turn, end_turn, finish = _turns(bars.turn)
    shape = (_ROWS, block_kv)
    d = scoped.k.shape[-1]
    dt = scoped.k.dtype
    p_smem = scoped.p.at[wg] if p_in_smem else None
    # Stores this warpgroup issues in an item before its output's: the dO rows'.
    early_stores = int(dos_ref is not None)

    def item_body(s, item, carry):
      b, g, i, j, n, unmasked, box = item
      rows = _half_rows(i, wg)
      q_tile, do_tile = (_item_tile(scoped, m, s) for m in range(2))
      # Global loads, issued before the wait for the item's rows.
      lse_RK = _per_row(lse_ref.at[b, g, rows], shape) * _LOG2E
      delta_RK = _per_row(delta_ref.at[b, g, rows], shape)
      keep = _masker(*_take_rows(scoped, shape, box), scoped.kseg)
      if dos_ref is not None:
        plgpu.copy_smem_to_gmem(do_tile, dos_ref.at[b, g, rows])
      if tile_frees:  # the gatherer's next refill waits for these tiles
        _release_tiles(bars, s, early_stores)

      def ds(s_RK, dp_RK, step, kslot, masked=None):
        """dS of one key step (q's dtype); masked as the forward's softmax."""
        start = j * block_size + step * block_kv
        p_RK = jnp.exp2(s_RK * (sm_scale * _LOG2E) - lse_RK)
        apply_mask = lambda p: jnp.where(keep(kslot, start), p, 0.0)
        if masked is None:
          p_RK = lax.cond(step < unmasked, lambda p: p, apply_mask, p_RK)
        elif masked:
          p_RK = apply_mask(p_RK)
        return (p_RK * (dp_RK - delta_RK)).astype(dt)

      def products(kslot, vslot, dq=None):
        """S = q K^T and dP = dO V^T on K slot kslot and V slot vslot, issued in a turn on
        the tensor cores (with dq = (acc_ref, dS, K slot): that dS K after them, left
        running), returned once done; frees the V slot."""
        def body(s_ref, dp_ref):
          with jax.named_scope("turn"):
            wait_turn()
          plgpu.wgmma(s_ref, q_tile, scoped.k.at[kslot].transpose((1, 0)))
          plgpu.wgmma(dp_ref, do_tile, scoped.v.at[vslot].transpose((1, 0)))
          if dq is not None:
            plgpu.wgmma(dq[0], dq[1], scoped.k.at[dq[2]])
          end_turn()
          wait_n = 0 if dq is None else 1
          with jax.named_scope("products_wait"):
            return (plgpu.wgmma_accumulator_load(s_ref, wait_n=wait_n),
                    plgpu.wgmma_accumulator_load(dp_ref, wait_n=wait_n))

        out = pl.run_scoped(body, plgpu.ACC(shape, jnp.float32), plgpu.ACC(shape, jnp.float32))
        plgpu.barrier_arrive(bars.v_free.at[vslot])
        return out

      def dq_turn(acc, ds16, kslot):
        """acc + dS K on K slot kslot in a turn of its own; frees the slot."""
        (acc,) = _mma_turn((wait_turn, end_turn), (acc,), [(ds16, scoped.k.at[kslot])], p_smem,
                           "dq_mma")
        plgpu.barrier_arrive(bars.k_free.at[kslot])
        return acc

      def wait_kv(kslot, vslot):
        with jax.named_scope("wait_kv"):
          plgpu.barrier_wait(bars.k.at[kslot])
          plgpu.barrier_wait(bars.v.at[vslot])

      def plain_step(step, carry, *, masked):
        """Key step `step` in two turns: S and dP, dS, then dq += dS K."""
        acc, gstep = carry
        kslot, vslot = lax.rem(gstep, k_stages), lax.rem(gstep, v_stages)
        wait_kv(kslot, vslot)
        s_RK, dp_RK = products(kslot, vslot)
        with jax.named_scope("ds"):
          ds16 = ds(s_RK, dp_RK, step, kslot, masked)
        return dq_turn(acc, ds16, kslot), gstep + 1

      def overlapped_step(step, carry, *, first):
        """Key step `step`: S = q K^T and dP = dO V^T of this step and (but in the first)
        dq += dS K of the previous one are issued together in one turn on the tensor cores;
        dS of this step is computed while dS K runs (as the forward's softmax)."""
        acc, ds16_prev, gstep = carry
        kslot, vslot = lax.rem(gstep, k_stages), lax.rem(gstep, v_stages)
        prev = lax.rem(gstep + k_stages - 1, k_stages)
        wait_kv(kslot, vslot)
        if first or p_smem is not None:
          # (Interpret mode: dS K through shared memory, in order, after S and dP.)
          s_RK, dp_RK = products(kslot, vslot)
          if not first:
            acc = _accumulate(acc, ds16_prev, scoped.k.at[prev], p_smem)
          with jax.named_scope("ds"):
            ds16 = ds(s_RK, dp_RK, step, kslot)
        else:
          def overlapped(refs):
            acc_ref, ds_ref = refs
            s_RK, dp_RK = products(kslot, vslot, (acc_ref, ds16_prev, prev))
            with jax.named_scope("ds"):
              ds_ref[...] = ds(s_RK, dp_RK, step, kslot)
            with jax.named_scope("dq_wait"):
              plgpu.wgmma_wait(0)

          acc, ds16 = pl.run_state(overlapped)((plgpu.ACC.init(acc), ds16_prev))
        if not first:
          plgpu.barrier_arrive(bars.k_free.at[prev])
        return acc, ds16, gstep + 1

      acc = plgpu.layout_cast(jnp.zeros((_ROWS, d), jnp.float32), plgpu.Layout.WGMMA)
      if overlap:
        ds16_0 = plgpu.layout_cast(jnp.zeros(shape, dt), plgpu.Layout.WGMMA)
        carry = overlapped_step(0, (acc, ds16_0, carry), first=True)
        # One loop, as the forward's overlapped schedule (C7513 when split).
        acc, ds16, gstep = lax.fori_loop(
            1, n, functools.partial(overlapped_step, first=False), carry)
        # The last step's dS K, in a turn of its own.
        acc = dq_turn(acc, ds16, lax.rem(gstep + k_stages - 1, k_stages))
      else:
        acc, gstep = _split_steps(0, unmasked, n, plain_step, (acc, carry))
      with jax.named_scope("epilogue"):
        q_tile[...] = (acc * sm_scale).astype(dt)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_tile, dq_ref.at[b, g, rows])
      return gstep

    item_loop(trips, item_body, jnp.int32(0))
    finish()
    if tile_frees:
      _release_tiles(bars, trips, 0)
    plgpu.wait_smem_to_gmem(0)


def _stage_counts(stages) -> tuple[int, int]:
  """A kernel's K and V pipeline depths: one count for both, or (K's, V's)."""
  ks, vs = (stages, stages) if isinstance(stages, int) else stages
  if ks < 2 or vs < 2:
    raise ValueError(f"the K/V streams need at least two stages each, got stages={stages}")
  return ks, vs


def _launch(kernel, args, out_type, *, name, layout, segment_ids_BT, block_size, block_kv, stages,
            presorted, d, dt, num_ctas, interpret, num_heads, kv_heads, pingpong,
            row_out=False):
  """Runs a compute kernel with its streams: persistent CTAs over the used items, four
  warpgroups, the shared-memory buffers and barriers of _Scoped (stages: _stage_counts';
  presorted: per operand whose rows the streams bring, whether it is in sorted order already
  or gathered row by row; args end with one view per such operand, [B, T, Hq, D] where it is
  gathered (for the halves box_halves marks), the operand itself, unused, where presorted;
  row_out: the kernel writes a per-row output; pingpong: the compute warpgroups take turns on
  the tensor cores, _turns; num_heads / kv_heads: query / KV heads, whose ratio, the query
  heads per KV group, sets the gathered halves' copies, _half_plans)."""
  ks, vs = _stage_counts(stages)
  group_heads = num_heads // kv_heads
  gathered = len(presorted)
  _, g, l = layout.row_src_BGL.shape
  ids, num, blk, steps, unmasked = persistent_items(layout, segment_ids_BT,
                                                    block_size=block_size, block_kv=block_kv)
  # With every operand presorted each half is a box already, on bars.rows.
  boxes = (jnp.zeros_like(blk) if all(presorted) else box_halves(layout, num_heads))
  num_ctas = _grid(num_ctas, interpret)
  transforms = _smem_transforms(dt)
  kernel = functools.partial(kernel, sm_scale=1.0 / math.sqrt(d), block_size=block_size,
                             block_kv=block_kv, k_stages=ks, v_stages=vs, num_groups=g,
                             items_per_group=l // ITEM_ROWS, grid=num_ctas,
                             p_in_smem=bool(interpret), presorted=presorted,
                             group_heads=group_heads)

  def entry(*refs):
    scratch = _Scoped(
        idx=None if all(presorted) else plgpu.SMEM((ITEM_ROWS,), jnp.int32),
        stages=[None if p else plgpu.SMEM((2, _ROWS, d), dt) for p in presorted],
        tiles=[plgpu.SMEM((2, 2, _ROWS, d) if p else (2, _ROWS, d), dt, transforms=transforms)
               for p in presorted],
        k=plgpu.SMEM((ks, block_kv, d), dt, transforms=transforms),
        v=plgpu.SMEM((vs, block_kv, d), dt, transforms=transforms),
        kseg=plgpu.SMEM((ks, block_kv), jnp.int32),
        rowi=plgpu.SMEM((2, 2, _ROWS), jnp.int32),
        row_out=plgpu.SMEM((2, _ROWS), jnp.float32) if row_out else None,
        p=plgpu.SMEM((2, _ROWS, block_kv), dt, transforms=transforms) if interpret else None,
        bars=_Bars(
            idx=plgpu.Barrier(),
            rows=plgpu.Barrier(
                # a box or a half's row copies, per operand; + segment, position
                num_arrivals=sum(1 if p else _half_arrivals(group_heads)
                                 for p in presorted) + 2,
                num_barriers=2),
            box=plgpu.Barrier(num_arrivals=gathered + 2, num_barriers=2),
            rows_free=plgpu.Barrier(num_arrivals=2),
            tile_free=plgpu.Barrier(num_arrivals=2, num_barriers=2) if any(presorted) else None,
            k=plgpu.Barrier(num_arrivals=2, num_barriers=ks),  # K, key segments
            v=plgpu.Barrier(num_barriers=vs),
            k_free=plgpu.Barrier(num_arrivals=2, num_barriers=ks),
            v_free=plgpu.Barrier(num_arrivals=2, num_barriers=vs),
            turn=plgpu.Barrier(num_barriers=2) if pingpong else None))
    pl.run_scoped(lambda scoped: kernel(*refs, scoped), scratch, collective_axes="wg")

  return _persistent_call(entry, out_type, name=name, num_ctas=num_ctas, warpgroups=4,
                          interpret=interpret)(ids, num, blk, steps, unmasked, boxes, *args)


def moba_forward_rows(q_BSD, layout, k_BTKD, v_BTKD, segment_ids_BT, *, block_size,
                      bs: MobaBlockSizes, interpret: bool | plgpu.InterpretGPUParams,
                      block_kv: int = 128, stages: int | tuple[int, int] = 2,
                      num_ctas: int | None = None, sorted_q: bool = False,
                      overlap: bool = False, pingpong: bool | None = None):
  """Partial output [B, G, L, D] (q dtype) and natural-log lse [B, G, L] per sorted row, as
  kernels.moba_forward_rows, on a layout padded with pad_rows=ITEM_ROWS; q_BSD is q reshaped
  to [B, T * Hq, D]; interpret as in _interpret_params. sorted_q: also return q's rows in
  sorted order, [B, G, L, D] (sorted_rows(q_BSD, layout) on the real rows of used items,
  other rows of q on their padding rows (_half_plans), which every kernel masks; rows of
  unused items are not written), which the kernel has gathered anyway and the backward
  kernels take as q_rows in place of a second gather. K/V tiles of block_kv keys through
  `stages` slots (one int for both, or (K's, V's)): the defaults (128 keys, two stages) were
  the fastest on the H200 at 16/16 heads x 128 (BENCHMARKS.md), and 128 keys in three
  stages do not fit its shared memory at head_dim 128. num_ctas: persistent CTAs (default:
  one per SM; four in interpret mode). overlap: each turn on the tensor cores issues a key
  step's QK^T with the previous step's PV, and the softmax runs under that PV
  (FlashAttention-3's intra-warpgroup overlap); else (the default: on the H200 at 16/16 heads
  x 128 the overlap was 3.5% slower alone and no faster in the step, BENCHMARKS.md) QK^T and PV
  take a turn each, the steps attended whole and the masked ones in two loops. pingpong: the
  two compute warpgroups take strict turns on the tensor cores (_turns), else each issues its
  products as soon as they are ready (a "turn" is then one issue). None: by head_dim, as
  measured on the H200 (BENCHMARKS.md, traced step at top-3): off at 128 (0.791 ms against
  0.827 with it at 16/16 heads), on below (0.545 against 0.554 without it at 14/2 x 64)."""
  b, _, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  _check_operands(q_BSD.dtype, d, bs)
  pingpong = d < 128 if pingpong is None else pingpong
  bkv = _check_layout(layout, block_size, block_kv)
  dt = q_BSD.dtype
  return _launch(
      functools.partial(_fwd_kernel, overlap=overlap),
      (layout.row_src_BGL, layout.row_seg_BGL, layout.row_pos_BGL, q_BSD, k_BTKD, v_BTKD,
       segment_ids_BT.astype(jnp.int32), _heads_view(q_BSD, k_BTKD)),
      [jax.ShapeDtypeStruct((b, g, l, d), dt), jax.ShapeDtypeStruct((b, g, l), jnp.float32)]
      + [jax.ShapeDtypeStruct((b, g, l, d), dt)] * sorted_q,
      name="moba_fwd_hopper", layout=layout, segment_ids_BT=segment_ids_BT,
      block_size=block_size, block_kv=bkv, stages=stages, presorted=(False,), d=d, dt=dt,
      row_out=True, num_ctas=num_ctas, interpret=interpret,
      num_heads=q_BSD.shape[1] // k_BTKD.shape[1], kv_heads=k_BTKD.shape[2], pingpong=pingpong)


def moba_dq_rows(q_BSD, do_BSD, lse_BS, delta_BS, layout, k_BTKD, v_BTKD, segment_ids_BT, *,
                 block_size, bs: MobaBlockSizes, interpret: bool | plgpu.InterpretGPUParams,
                 block_kv: int | None = None, stages: int | tuple[int, int] = (3, 2),
                 num_ctas: int | None = None, presorted: bool = True, q_rows=None, do_rows=None,
                 sorted_do: bool = False, overlap: bool | None = None,
                 pingpong: bool | None = None):
  """Partial dq [B, G, L, D] (q dtype) per sorted row, as kernels.moba_dq_rows, on a layout
  padded with pad_rows=ITEM_ROWS. lse and delta are read per sorted row (gathered here, a
  few bytes per row); q and dO too with presorted (in sorted order, gather_rows, the same
  arrays moba_dkv reads, so one gather serves both), else the kernel gathers their rows
  itself. Two operands take twice the staging and tile space of the forward, hence 64-key
  K/V tiles at head_dim 128 (block_kv None: 64 there, 128 below, where they fit and were the
  faster on the H200: 0.572 ms against 0.617 at 14/2 x 64, BENCHMARKS.md).
  stages: K's and V's pipeline depths (one int for both): a K tile stays in use
  until the next step's dS K is done, a V tile only until this step's dP, hence the default
  three K stages and two V. q_rows / do_rows (presorted
  only): q's / dO's rows already in sorted order (the forward's sorted_q output,
  gather_rows), in place of q_BSD / do_BSD, which may then be None.

  sorted_do: the kernel gathers dO's rows itself (from do_BSD; q as presorted says) and
  also returns them in sorted order, [B, G, L, D] on the real rows of used items (padding
  rows as sorted_q's), for moba_dkv's do_rows: (dq, do_rows).

  overlap: each turn on the tensor cores issues a key step's S and dP with the previous
  step's dS K, and dS is computed under that dS K (as the forward's); else S, dP and dS K
  take a turn each. None: by head_dim, as measured on the H200 (BENCHMARKS.md, traced step at
  top-3, no ping-pong): on at 128 (0.969 ms against 0.987 without it at 16/16 heads), off
  below (0.617 against 0.644 with it at 14/2 x 64). pingpong: as moba_forward_rows'; None:
  off (at both head_dims the faster: 0.969 against 0.981 ms with it at 16/16 heads, 0.644 against
  0.670 at 14/2 x 64, both with overlap)."""
  b, g, l = layout.row_src_BGL.shape
  if (q_rows is not None or do_rows is not None) and not presorted:
    raise ValueError("q_rows / do_rows (rows in sorted order) need presorted=True")
  if sorted_do and (do_BSD is None or do_rows is not None):
    raise ValueError("sorted_do gathers dO's rows in the kernel: give do_BSD, not do_rows")
  d = (q_BSD if q_BSD is not None else q_rows).shape[-1]
  block_kv = (64 if d >= 128 else 128) if block_kv is None else block_kv
  bkv = _check_layout(layout, block_size, block_kv)
  q = _sorted(q_BSD, q_rows, layout, interpret, "q") if presorted else q_BSD
  if sorted_do or not presorted:
    do = do_BSD.astype(q.dtype)
  else:
    do = _sorted(do_BSD, do_rows, layout, interpret, "do").astype(q.dtype)
  dt = q.dtype
  _check_operands(dt, d, bs)
  overlap = d >= 128 if overlap is None else overlap
  pingpong = bool(pingpong)
  out = _launch(
      functools.partial(_dq_kernel, overlap=overlap),
      (layout.row_src_BGL, layout.row_seg_BGL, layout.row_pos_BGL, sorted_rows(lse_BS, layout),
       sorted_rows(delta_BS, layout), q, do, k_BTKD, v_BTKD,
       segment_ids_BT.astype(jnp.int32),
       q if presorted else _heads_view(q, k_BTKD),
       do if presorted and not sorted_do else _heads_view(do, k_BTKD)),
      [jax.ShapeDtypeStruct((b, g, l, d), dt)] * (2 if sorted_do else 1),
      name="moba_dq_hopper", layout=layout, segment_ids_BT=segment_ids_BT,
      block_size=block_size, block_kv=bkv, stages=stages,
      presorted=(presorted, presorted and not sorted_do), d=d, dt=dt, num_ctas=num_ctas,
      interpret=interpret, num_heads=lse_BS.shape[1] // k_BTKD.shape[1],
      kv_heads=k_BTKD.shape[2], pingpong=pingpong)
  return tuple(out) if sorted_do else out[0]


def _heads_view(x_BSD, k_BTKD):
  """[B, T * Hq, D] -> [B, T, Hq, D] (a view: XLA passes the same buffer)."""
  b, s, d = x_BSD.shape
  t = k_BTKD.shape[1]
  return x_BSD.reshape(b, t, s // t, d)
