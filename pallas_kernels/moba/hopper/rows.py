"""The forward and dq kernels on row work items (ITEM_ROWS sorted rows that read one KV
block), with their streams (`streams`): the two kernels, their launch and their entries
moba_forward_rows and moba_dq_rows.
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

from pallas_kernels.moba.hopper.common import (_accumulate, _check_layout, _check_operands,
                                               _consumer_setup, _grid, ITEM_ROWS, _mma_turn,
                                               _per_row, _persistent_call, _ROWS, _slots,
                                               _smem_transforms, _sorted, sorted_rows, _turns)
from pallas_kernels.moba.hopper.streams import (_Bars, box_halves, _half_arrivals, _half_rows,
                                                _item_tile, persistent_items, _release_tiles,
                                                _Scoped, _start_streams, _take_rows, _tile_frees)
from pallas_kernels.moba.kernels import _LOG2E, _MASK, MobaBlockSizes


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


def _own_steps(n, halves, half_steps: bool):
  """The key steps this compute warpgroup runs of an item with n: with half_steps its half's
  (persistent_items: an own-block half whose queries end before the item's last key tile
  stops before it), else all n."""
  return jnp.where(lax.axis_index("wg") == 0, *halves) if half_steps else n


def _check_half_steps(half_steps: bool, pingpong: bool):
  if half_steps and pingpong:
    raise ValueError("half_steps=True needs pingpong=False: under ping-pong both compute "
                     "warpgroups take every turn of an item")


class RowSchedule(NamedTuple):
  """How the forward or dq kernel runs an item (moba_forward_rows' and moba_dq_rows' arguments
  of the same names, their defaults resolved)."""
  block_kv: int     # keys per K/V tile (at most the block's)
  overlap: bool     # a step's first products issued with the previous step's update
  pingpong: bool    # strict turns on the tensor cores
  half_steps: bool  # each compute warpgroup on its own half's key steps


def forward_schedule(d: int, *, block_kv: int = 128, overlap: bool = False,
                     pingpong: bool | None = None, half_steps: bool | None = None
                     ) -> RowSchedule:
  """moba_forward_rows' schedule at head_dim d (its docstring gives the measurements)."""
  pingpong = d < 128 if pingpong is None else pingpong
  half_steps = not pingpong if half_steps is None else half_steps
  _check_half_steps(half_steps, pingpong)
  return RowSchedule(block_kv, overlap, pingpong, half_steps)


def dq_schedule(d: int, *, block_kv: int | None = None, overlap: bool | None = None,
                pingpong: bool | None = None, half_steps: bool | None = None) -> RowSchedule:
  """moba_dq_rows' schedule at head_dim d (its docstring gives the measurements)."""
  block_kv = (64 if d >= 128 else 128) if block_kv is None else block_kv
  overlap = d >= 128 if overlap is None else overlap
  pingpong = bool(pingpong)
  half_steps = d >= 128 and not pingpong if half_steps is None else half_steps
  _check_half_steps(half_steps, pingpong)
  return RowSchedule(block_kv, overlap, pingpong, half_steps)


def _pass_steps(bars, first, n, gstep, k_stages, v_stages):
  """Key steps first..n-1 of an item that this compute warpgroup's rows do not reach (the
  other half's, half_steps): each K and V slot waited for and freed unread, as the K/V stream
  expects of both compute warpgroups (the wait also keeps this warpgroup's view of each
  barrier's phase). Returns the global step count after them."""
  def step(_, gstep):
    kslot, vslot = lax.rem(gstep, k_stages), lax.rem(gstep, v_stages)
    with jax.named_scope("wait_kv"):
      plgpu.barrier_wait(bars.k.at[kslot])
      plgpu.barrier_wait(bars.v.at[vslot])
    plgpu.barrier_arrive(bars.k_free.at[kslot])
    plgpu.barrier_arrive(bars.v_free.at[vslot])
    return gstep + 1

  return lax.fori_loop(first, n, step, gstep)


def _fwd_kernel(ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref, src_ref, seg_ref,
                pos_ref, q_ref, k_ref, v_ref, kseg_ref, q_view, o_ref, lse_ref, *refs, sm_scale,
                block_size, block_kv, k_stages, v_stages, num_groups, items_per_group, grid,
                p_in_smem, presorted, group_heads, overlap, half_steps):
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
      b, g, i, j, n_item, halves, unmasked, box = item
      n = _own_steps(n_item, halves, half_steps)
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
      if half_steps:  # after the output's store: these wait on the other half's last steps
        gstep = _pass_steps(bars, n, n_item, gstep, k_stages, v_stages)
      return gstep

    item_loop(trips, item_body, jnp.int32(0))
    finish()
    plgpu.wait_smem_to_gmem(0)


def _dq_kernel(ids_ref, num_ref, blk_ref, steps_ref, unmasked_ref, box_ref, src_ref, seg_ref,
               pos_ref, lse_ref, delta_ref, q_ref, do_ref, k_ref, v_ref, kseg_ref, q_view, do_view,
               dq_ref, *refs, sm_scale, block_size, block_kv, k_stages, v_stages, num_groups,
               items_per_group, grid, p_in_smem, presorted, group_heads, overlap, half_steps):
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
      b, g, i, j, n_item, halves, unmasked, box = item
      n = _own_steps(n_item, halves, half_steps)
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
      if half_steps:  # after dq's store: these wait on the other half's last steps
        gstep = _pass_steps(bars, n, n_item, gstep, k_stages, v_stages)
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
                      overlap: bool = False, pingpong: bool | None = None,
                      half_steps: bool | None = None):
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
  0.827 with it at 16/16 heads), on below (0.545 against 0.554 without it at 14/2 x 64).
  half_steps: each compute warpgroup runs only the key steps its own 64 rows reach (an
  own-block half whose queries end a key tile before the other half's stops there), passing
  the rest's K/V slots on unread; needs pingpong off. None: whenever pingpong is off (H200,
  16/16 x 128, top-3: 0.770 -> 0.765 ms, BENCHMARKS.md)."""
  b, _, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  _check_operands(q_BSD.dtype, d, bs)
  sched = forward_schedule(d, block_kv=block_kv, overlap=overlap, pingpong=pingpong,
                           half_steps=half_steps)
  bkv = _check_layout(layout, block_size, sched.block_kv)
  dt = q_BSD.dtype
  return _launch(
      functools.partial(_fwd_kernel, overlap=sched.overlap, half_steps=sched.half_steps),
      (layout.row_src_BGL, layout.row_seg_BGL, layout.row_pos_BGL, q_BSD, k_BTKD, v_BTKD,
       segment_ids_BT.astype(jnp.int32), _heads_view(q_BSD, k_BTKD)),
      [jax.ShapeDtypeStruct((b, g, l, d), dt), jax.ShapeDtypeStruct((b, g, l), jnp.float32)]
      + [jax.ShapeDtypeStruct((b, g, l, d), dt)] * sorted_q,
      name="moba_fwd_hopper", layout=layout, segment_ids_BT=segment_ids_BT,
      block_size=block_size, block_kv=bkv, stages=stages, presorted=(False,), d=d, dt=dt,
      row_out=True, num_ctas=num_ctas, interpret=interpret,
      num_heads=q_BSD.shape[1] // k_BTKD.shape[1], kv_heads=k_BTKD.shape[2],
      pingpong=sched.pingpong)


def moba_dq_rows(q_BSD, do_BSD, lse_BS, delta_BS, layout, k_BTKD, v_BTKD, segment_ids_BT, *,
                 block_size, bs: MobaBlockSizes, interpret: bool | plgpu.InterpretGPUParams,
                 block_kv: int | None = None, stages: int | tuple[int, int] = (3, 2),
                 num_ctas: int | None = None, presorted: bool = True, q_rows=None, do_rows=None,
                 sorted_do: bool = False, overlap: bool | None = None,
                 pingpong: bool | None = None, half_steps: bool | None = None):
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
  0.670 at 14/2 x 64, both with overlap). half_steps: as moba_forward_rows'; None: on at
  head_dim 128 without ping-pong (16/16 x 128, top-3, 64-key tiles: 0.963 -> 0.950 ms), off
  below (14/2 x 64, block 256, top-8, 128-key tiles, where halves rarely differ: 0.849 ->
  0.865 with it; BENCHMARKS.md)."""
  b, g, l = layout.row_src_BGL.shape
  if (q_rows is not None or do_rows is not None) and not presorted:
    raise ValueError("q_rows / do_rows (rows in sorted order) need presorted=True")
  if sorted_do and (do_BSD is None or do_rows is not None):
    raise ValueError("sorted_do gathers dO's rows in the kernel: give do_BSD, not do_rows")
  d = (q_BSD if q_BSD is not None else q_rows).shape[-1]
  sched = dq_schedule(d, block_kv=block_kv, overlap=overlap, pingpong=pingpong,
                      half_steps=half_steps)
  bkv = _check_layout(layout, block_size, sched.block_kv)
  q = _sorted(q_BSD, q_rows, layout, interpret, "q") if presorted else q_BSD
  if sorted_do or not presorted:
    do = do_BSD.astype(q.dtype)
  else:
    do = _sorted(do_BSD, do_rows, layout, interpret, "do").astype(q.dtype)
  dt = q.dtype
  _check_operands(dt, d, bs)
  out = _launch(
      functools.partial(_dq_kernel, overlap=sched.overlap, half_steps=sched.half_steps),
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
      kv_heads=k_BTKD.shape[2], pingpong=sched.pingpong)
  return tuple(out) if sorted_do else out[0]


def _heads_view(x_BSD, k_BTKD):
  """[B, T * Hq, D] -> [B, T, Hq, D] (a view: XLA passes the same buffer)."""
  b, s, d = x_BSD.shape
  t = k_BTKD.shape[1]
  return x_BSD.reshape(b, t, s // t, d)
