"""The streams of the forward and dq kernels on row work items (ITEM_ROWS sorted rows that read
one KV block): the item list and each item's box halves, the item reader, the two streaming
warpgroups (K/V tiles; the items' query rows, gathered by row id after _half_plans), their
shared-memory buffers and barriers (_Scoped, _Bars), and the compute warpgroups' end of the
row handoff (_take_rows, the tiles' release).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.moba import kv_layout
from pallas_kernels.moba.hopper.common import (_await_last_frees, ITEM_ROWS, _per_row, _ROWS,
                                               _slots, _trips)

_IDS_AHEAD = 8  # row ids the gatherer reads ahead of their copies (registers: it keeps 24)


def _bulk_copy(src, dst, barrier):
  """src -> dst (gmem -> smem) for a contiguous slice within bounds into an unswizzled buffer
  (the row ids, the rows' segments and positions, the key segments): Mosaic GPU issues these
  as one bulk copy from a pointer (cp.async.bulk) instead of a tensor copy through a TMA
  descriptor, whose coordinates and descriptor address each issue forms again, and with no
  clamping of the slice (every slice here is in bounds: items and key tiles come from the
  layout). The gathered rows' staging buffer takes no such copies: Mosaic GPU's transform
  inference gives it a 128-byte swizzle (1 x 64 tiles) for the compute warpgroups' loads, and
  a swizzled copy is a tensor copy. On the H200 the forward's step at 16/16 x 128, block 512,
  top-3 took 0.752-0.755 ms against 0.760-0.762 with tensor copies (three pairs of traces);
  dq and 14/2 x 64 did not move (BENCHMARKS.md)."""
  plgpu.copy_gmem_to_smem(src, dst, barrier, oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)


def persistent_items(layout, segment_ids_BT, *, block_size: int, block_kv: int):
  """Work items of the forward: every ITEM_ROWS-row run of a (row, KV group)'s
  sorted rows (the layout padded with pad_rows=ITEM_ROWS, so each reads one block).

  Returns int32 arrays: the used items' flat ids (b * G + g) * I + i, used ones first, and
  their count [1]; per flat id its block, the key steps of each of its two halves ([., 2]:
  an own-block half stops after its last query's tile, a half of padding rows only takes one;
  the item streams the longer half's) and how many of them come first unmasked (every (row,
  key) pair attended; kv_layout.attended_key_tiles, padding rows ignored: their outputs are
  never read)."""
  b, g, l = layout.row_pos_BGL.shape
  items = l // ITEM_ROWS
  per_item = layout.chunk_block_BGC.shape[-1] // items
  blk_BGI = layout.chunk_block_BGC.reshape(b, g, items, per_item)[..., 0]
  blk = blk_BGI.reshape(-1)
  pos = jnp.where(layout.row_seg_BGL != 0, layout.row_pos_BGL, 0).reshape(-1, 2, _ROWS)
  last = pos.max(-1) - jnp.maximum(blk, 0)[:, None] * block_size
  steps = jnp.clip(last // block_kv + 1, 1, block_size // block_kv).astype(jnp.int32)
  unmasked = kv_layout.attended_key_tiles(
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
  """Returns item_at(s): (b, g, i, block, key steps, (key steps of half 0, of half 1),
  unmasked steps, box halves) of this CTA's s-th item (cta + s * grid; persistent_items' fields,
  the item's key steps the longer half's), and item_loop(trips, body, init): the loop over the
  CTA's items, carry = body(s, item_at(s), carry), with each item's fields loaded one item ahead
  and its id two ahead, so that these global loads (a dependent pair) wait behind an item's
  work instead of in front of the next one."""
  cta = lax.axis_index("cta")
  flat_at = lambda s: ids_ref[jnp.minimum(cta + s * grid, ids_ref.shape[0] - 1)]

  def fields(flat):
    i = lax.rem(flat, items_per_group)
    bg = lax.div(flat, items_per_group)
    halves = (steps_ref[flat, 0], steps_ref[flat, 1])
    return (lax.div(bg, num_groups), lax.rem(bg, num_groups), i, blk_ref[flat],
            jnp.maximum(*halves), halves, unmasked_ref[flat], box_ref[flat])

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
  group, _half_plans) into a staging buffer declared without transforms (Mosaic GPU lays it
  out in 1 x 64 tiles with a 128-byte swizzle, which one-row boxes fill), which the compute
  warpgroups move into their 8-row tiles. Up to 128 copies per item and ref, issued by one
  thread, would hold up the K/V stream if one warpgroup issued both.
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
      b, g, _, j, n, *_ = item

      def step_body(step, gstep):
        kslot, vslot = lax.rem(gstep, k_stages), lax.rem(gstep, v_stages)
        keys = (b, pl.ds(j * block_size + step * block_kv, block_kv), g)
        with jax.named_scope("wait_k_free"):
          plgpu.barrier_wait(bars.k_free.at[kslot])
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[kslot], bars.k.at[kslot])
        _bulk_copy(kseg_ref.at[b, keys[1]], scoped.kseg.at[kslot], bars.k.at[kslot])
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
      _bulk_copy(src_ref.at[b, g, pl.ds(i * ITEM_ROWS, ITEM_ROWS)], idx_smem, bars.idx)

    def copy_row_values(b, g, i, w, bar):
      for n, ref in enumerate(row_refs):
        _bulk_copy(ref.at[b, g, _half_rows(i, w)], scoped.rowi.at[w, n], bar)

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
      b, g, i, *_, box = item_at(s)
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
  stages: Any   # per gathered ref: (2, 64, D) staging, no declared transforms (None: presorted)
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
