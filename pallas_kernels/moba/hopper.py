"""Pallas Mosaic GPU (Hopper: TMA, wgmma, warp specialization) forward kernel on the
KV-centric layout: FlashAttention-3's structure, made persistent.

Same contract as `kernels.moba_forward_rows` (partial output and natural-log lse per sorted
row), so the combine in attention.py does not change. What differs:

* Work items of ITEM_ROWS = 128 sorted rows, one 64-row half per compute warpgroup; the
  layout pads each block's run to 128 rows (build_kv_layout(pad_rows=ITEM_ROWS)), so an item
  reads one KV block and its two halves share every K/V tile.
* One CTA per SM, three warpgroups: a producer streams the items' query rows and their
  blocks' K/V tiles (`stages` slots) by TMA, running on from one item into the next;
  the two compute warpgroups run QK^T, the online softmax and PV on wgmma (P from registers)
  and take turns on the tensor cores (one's softmax under the other's products). Each CTA
  takes items cta, cta + grid, ... of the list of used items (compacted outside).
* The kernel gathers the query rows itself: the item's row ids by one copy into shared
  memory, one TMA copy per row into a plain staging buffer (the swizzled wgmma operand tiles
  take no single-row copies), then each compute warpgroup moves its half into its q tile.
* Items that attend every (row, key) pair of their block run without the mask; own-block
  items stop after their last query's key tile.

bf16 only (wgmma's 16-bit path); float32 inputs stay on the Triton kernels. In interpret mode
(CPU tests) P goes through shared memory, the one wgmma operand form the interpreter runs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.moba import gating
from pallas_kernels.moba.kernels import _LOG2E, _MASK, MobaBlockSizes

_ROWS = 64  # one warpgroup's wgmma M


def _smem_transforms(dtype) -> tuple:
  """wgmma operand layout in shared memory: 8-row tiles of 128 bytes, 128-byte swizzle."""
  per_128b = 128 // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, per_128b)), plgpu.SwizzleTransform(128))


def check_supported(q_dtype, head_dim: int, bs: MobaBlockSizes) -> None:
  """Raises with the reason when the Hopper kernel cannot run these arguments."""
  if jnp.dtype(q_dtype) != jnp.bfloat16:
    raise ValueError(f"the Mosaic GPU kernel takes bfloat16 q/k/v, got {jnp.dtype(q_dtype)}; "
                     "use forward_kernel='triton' for other dtypes")
  if head_dim % 64:
    raise ValueError(f"the Mosaic GPU kernel needs head_dim % 64 == 0, got {head_dim}")
  if bs.block_rows != _ROWS:
    raise ValueError(f"the Mosaic GPU kernel needs MobaBlockSizes.block_rows == {_ROWS}, got "
                     f"{bs.block_rows}")


def _interpret_params(interpret):
  """interpret: False (compile), True (GPU interpret mode) or the interpreter's own
  parameters (e.g. plgpu.InterpretGPUParams(detect_races=True), as the tests run it)."""
  if isinstance(interpret, plgpu.InterpretGPUParams):
    return interpret
  return plgpu.InterpretGPUParams() if interpret else False


ITEM_ROWS = 2 * _ROWS  # rows per work item: one 64-row half per compute warpgroup


def persistent_items(layout, segment_ids_BT, *, block_size: int, block_kv: int):
  """Work items of the forward: every ITEM_ROWS-row run of a (row, KV group)'s
  sorted rows (the layout padded with pad_rows=ITEM_ROWS, so each reads one block).

  Returns int32 arrays: the used items' flat ids (b * G + g) * I + i, used ones first, and
  their count [1]; per flat id its block, its key steps (own-block items stop after their
  last query's tile) and whether it is full (every (row, key) pair attended: no mask)."""
  b, g, l = layout.row_pos_BGL.shape
  items = l // ITEM_ROWS
  per_item = layout.chunk_block_BGC.shape[-1] // items
  blk_BGI = layout.chunk_block_BGC.reshape(b, g, items, per_item)[..., 0]
  blk = blk_BGI.reshape(-1)
  pos = jnp.where(layout.row_seg_BGL != 0, layout.row_pos_BGL, 0).reshape(-1, ITEM_ROWS)
  last = pos.max(-1) - jnp.maximum(blk, 0) * block_size
  steps = jnp.clip(last // block_kv + 1, 1, block_size // block_kv).astype(jnp.int32)
  full = gating.full_chunks(blk_BGI, layout.row_seg_BGL, layout.row_pos_BGL, segment_ids_BT,
                            num_blocks=segment_ids_BT.shape[1] // block_size,
                            block_rows=ITEM_ROWS).reshape(-1)
  used = blk >= 0
  ids = jnp.nonzero(used, size=used.size, fill_value=0)[0].astype(jnp.int32)
  return ids, used.sum(dtype=jnp.int32)[None], blk.astype(jnp.int32), steps, full


def _fwd_kernel(ids_ref, num_ref, blk_ref, steps_ref, full_ref, src_ref, seg_ref, pos_ref, q_ref,
                k_ref, v_ref, kseg_ref, o_ref, lse_ref, scoped, *, sm_scale, block_size, block_kv,
                stages, num_groups, items_per_group, grid, p_in_smem):
  """Three warpgroups per CTA: two compute warpgroups (64 rows of an item each) and one
  that streams the items' query rows and K/V tiles (`stages` slots) by TMA. Each
  CTA runs items cta, cta + grid, ... of the used-item list, so the stream runs on across
  items.

  TMA copies boxes, and the wgmma operand layout (8-row swizzled tiles) takes no single-row
  copies, so an item's query rows are gathered row by row into a plain staging buffer (the
  row ids first, by one copy into shared memory), and each compute warpgroup moves its half
  into its swizzled q tile through registers; its output leaves through that tile."""
  (stage_smem, q_smem, idx_smem, k_smem, v_smem, lse_smem, p_smem), bars = scoped
  idx_bar, q_bar, k_bar, v_bar, q_free, k_free, v_free, sched = bars
  wg = lax.axis_index("wg")
  cta = lax.axis_index("cta")
  num = num_ref[0]
  trips = jnp.maximum(num - cta + grid - 1, 0) // grid

  def item_at(s):
    flat = ids_ref[cta + s * grid]
    i = lax.rem(flat, items_per_group)
    bg = lax.div(flat, items_per_group)
    return (lax.div(bg, num_groups), lax.rem(bg, num_groups), i, blk_ref[flat],
            steps_ref[flat], full_ref[flat])

  def kv_rows(b, g, j, step):
    return (b, pl.ds(j * block_size + step * block_kv, block_kv), g)

  @pl.when(wg == 2)
  def _producer():
    plgpu.set_max_registers(40, action="decrease")

    def item_body(s, gstep):
      b, g, i, j, n, _ = item_at(s)
      islot = lax.rem(s, 2)
      plgpu.copy_gmem_to_smem(src_ref.at[b, g, pl.ds(i * ITEM_ROWS, ITEM_ROWS)],
                              idx_smem.at[islot], idx_bar.at[islot])
      plgpu.barrier_wait(idx_bar.at[islot])
      plgpu.barrier_wait(q_free)  # both halves of the previous item moved to their q tiles
      for w in range(2):
        for r in range(_ROWS):
          plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(idx_smem[islot, w * _ROWS + r], 1)],
                                  stage_smem.at[w, pl.ds(r, 1)], q_bar.at[w])

      def step_body(step, gstep):
        slot = lax.rem(gstep, stages)
        plgpu.barrier_wait(k_free.at[slot])
        plgpu.copy_gmem_to_smem(k_ref.at[kv_rows(b, g, j, step)], k_smem.at[slot],
                                k_bar.at[slot])
        plgpu.barrier_wait(v_free.at[slot])
        plgpu.copy_gmem_to_smem(v_ref.at[kv_rows(b, g, j, step)], v_smem.at[slot],
                                v_bar.at[slot])
        return gstep + 1

      return lax.fori_loop(0, n, step_body, gstep)

    lax.fori_loop(0, trips, item_body, jnp.int32(0))
    # The compute warpgroups free every slot once more than it was filled (they free them
    # all at the start): observe those last phases, which also waits for them to finish.
    plgpu.barrier_wait(q_free)
    for slot in range(stages):
      plgpu.barrier_wait(k_free.at[slot])
      plgpu.barrier_wait(v_free.at[slot])

  @pl.when(wg < 2)
  def _consumer():
    plgpu.set_max_registers(232, action="increase")
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    shape = (_ROWS, block_kv)
    d = q_smem.shape[-1]
    # Every slot starts free: one arrival per compute warpgroup.
    plgpu.barrier_arrive(q_free)
    for slot in range(stages):
      plgpu.barrier_arrive(k_free.at[slot])
      plgpu.barrier_arrive(v_free.at[slot])

    def schedule():  # the two warpgroups take turns on the tensor cores
      plgpu.barrier_arrive(sched)
      plgpu.barrier_wait(sched)

    pl.when(wg == 1)(schedule)

    def item_body(s, gstep):
      b, g, i, j, n, full = item_at(s)
      rows = pl.ds(i * ITEM_ROWS + wg * _ROWS, _ROWS)
      seg_R = plgpu.load(seg_ref.at[b, g, rows], layout=row_layout, optimized=False)
      pos_R = plgpu.load(pos_ref.at[b, g, rows], layout=row_layout, optimized=False)
      seg_RK = lax.broadcast_in_dim(seg_R, shape, [0])
      pos_RK = lax.broadcast_in_dim(pos_R, shape, [0])
      q_tile = q_smem.at[wg]
      plgpu.barrier_wait(q_bar.at[wg])
      q_tile[...] = stage_smem.at[wg][...]
      plgpu.commit_smem()
      plgpu.barrier_arrive(q_free)  # the staging buffer may take the next item's rows

      def step_body(step, carry):
        acc, m_prev, l_prev, gstep = carry
        slot = lax.rem(gstep, stages)
        start = j * block_size + step * block_kv
        plgpu.barrier_wait(k_bar.at[slot])

        def qk(acc_ref):
          plgpu.wgmma(acc_ref, q_tile, k_smem.at[slot].transpose((1, 0)))
          schedule()
          return acc_ref[...]

        s_RK = pl.run_scoped(qk, plgpu.ACC(shape, jnp.float32))
        plgpu.barrier_arrive(k_free.at[slot])

        def masked(s_RK):
          kseg_K = plgpu.load(kseg_ref.at[b, pl.ds(start, block_kv)],
                              layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)
          kpos_RK = start + plgpu.broadcasted_iota(jnp.int32, shape, 1,
                                                   layout=plgpu.Layout.WGMMA)
          keep = ((seg_RK == lax.broadcast_in_dim(kseg_K, shape, [1])) & (seg_RK != 0)
                  & (kpos_RK <= pos_RK))
          return jnp.where(keep, s_RK * (sm_scale * _LOG2E), _MASK)

        s_RK = lax.cond(full != 0, lambda s_RK: s_RK * (sm_scale * _LOG2E), masked, s_RK)
        m_next = jnp.maximum(m_prev, s_RK.max(axis=1))
        corr = jnp.exp2(m_prev - m_next)
        p = jnp.exp2(s_RK - lax.broadcast_in_dim(m_next, shape, [0]))
        l_next = l_prev * corr + p.sum(axis=1)
        acc = acc * lax.broadcast_in_dim(corr, acc.shape, [0])
        p16 = p.astype(q_smem.dtype)
        acc, l_next, m_next, p16 = lax.optimization_barrier((acc, l_next, m_next, p16))
        plgpu.barrier_arrive(sched)  # softmax done
        plgpu.barrier_wait(v_bar.at[slot])
        plgpu.barrier_wait(sched)  # tensor cores free
        if p_in_smem:
          # Interpret mode runs wgmma on shared-memory operands into a fresh accumulator only.
          p_smem.at[wg][...] = p16
          plgpu.commit_smem()

          def pv_fresh(acc_ref):
            plgpu.wgmma(acc_ref, p_smem.at[wg], v_smem.at[slot])
            return acc_ref[...]

          acc = acc + pl.run_scoped(pv_fresh, plgpu.ACC(acc.shape, jnp.float32))
        else:
          def pv(acc_ref):
            plgpu.wgmma(acc_ref, p16, v_smem.at[slot])

          acc = pl.run_state(pv)(plgpu.ACC.init(acc))
        plgpu.barrier_arrive(v_free.at[slot])
        return acc, m_next, l_next, gstep + 1

      init = (plgpu.layout_cast(jnp.zeros((_ROWS, d), jnp.float32), plgpu.Layout.WGMMA),
              plgpu.layout_cast(jnp.full((_ROWS,), _MASK, jnp.float32), row_layout),
              plgpu.layout_cast(jnp.zeros((_ROWS,), jnp.float32), row_layout), gstep)
      acc, m, l, gstep = lax.fori_loop(0, n, step_body, init)
      # The output leaves through the q tile, which the next item's rows overwrite once the
      # copy has read it.
      q_tile[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(q_smem.dtype)
      lse_smem.at[wg][...] = (m + jnp.log2(l)) / _LOG2E  # natural-log lse
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(q_tile, o_ref.at[b, g, rows])
      plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[b, g, rows])
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      return gstep

    lax.fori_loop(0, trips, item_body, jnp.int32(0))
    pl.when(wg == 0)(schedule)
    plgpu.wait_smem_to_gmem(0)


def moba_forward_rows(q_BSD, layout, k_BTKD, v_BTKD, segment_ids_BT, *, block_size,
                      bs: MobaBlockSizes, interpret: bool | plgpu.InterpretGPUParams,
                      block_kv: int = 128, stages: int = 2, num_ctas: int | None = None):
  """Partial output [B, G, L, D] (q dtype) and natural-log lse [B, G, L] per sorted row, as
  kernels.moba_forward_rows, on a layout padded with pad_rows=ITEM_ROWS; q_BSD is q reshaped
  to [B, T * Hq, D]; interpret as in _interpret_params. K/V tiles of block_kv keys through
  `stages` slots: the defaults (128 keys, two stages) were the fastest on the H200 at 16/16
  heads x 128 (BENCHMARKS.md), and 128 keys in three stages do not fit its shared memory at
  head_dim 128. num_ctas: persistent CTAs (default: one per SM; four in interpret mode)."""
  b, s, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  check_supported(q_BSD.dtype, d, bs)
  if l % ITEM_ROWS or layout.chunk_block_BGC.shape[-1] % (l // ITEM_ROWS):
    raise ValueError(f"the Mosaic GPU forward needs a layout padded to {ITEM_ROWS} rows "
                     "(build_kv_layout(..., pad_rows=hopper.ITEM_ROWS))")
  bkv = min(block_kv, block_size)
  if block_size % bkv or bkv % 64:
    raise ValueError(f"the Mosaic GPU forward needs block_kv % 64 == 0 dividing "
                     f"block_size={block_size}, got {bkv}")
  ids, num, blk, steps, full = persistent_items(layout, segment_ids_BT, block_size=block_size,
                                                block_kv=bkv)
  if num_ctas is None:
    num_ctas = 4 if interpret else getattr(jax.devices()[0], "core_count", 132)
  transforms = _smem_transforms(q_BSD.dtype)
  dt = q_BSD.dtype
  kernel = functools.partial(
      _fwd_kernel, sm_scale=1.0 / math.sqrt(d), block_size=block_size, block_kv=bkv,
      stages=stages, num_groups=g, items_per_group=l // ITEM_ROWS, grid=num_ctas,
      p_in_smem=interpret)

  def entry(*refs):
    scratch = [plgpu.SMEM((2, _ROWS, d), dt),
               plgpu.SMEM((2, _ROWS, d), dt, transforms=transforms),
               plgpu.SMEM((2, ITEM_ROWS), jnp.int32),
               plgpu.SMEM((stages, bkv, d), dt, transforms=transforms),
               plgpu.SMEM((stages, bkv, d), dt, transforms=transforms),
               plgpu.SMEM((2, _ROWS), jnp.float32),
               plgpu.SMEM((2, _ROWS, bkv), dt, transforms=transforms) if interpret else None]
    bars = (plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_arrivals=_ROWS, num_barriers=2),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_arrivals=2),
            plgpu.Barrier(num_arrivals=2, num_barriers=stages),
            plgpu.Barrier(num_arrivals=2, num_barriers=stages),
            plgpu.Barrier(num_arrivals=2))
    pl.run_scoped(lambda *scoped: kernel(*refs, scoped), scratch, bars, collective_axes="wg")

  call = plgpu.kernel(
      entry,
      out_type=[jax.ShapeDtypeStruct((b, g, l, d), dt),
                jax.ShapeDtypeStruct((b, g, l), jnp.float32)],
      grid=(num_ctas,),
      grid_names=("cta",),
      num_threads=3,
      thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=True),
      interpret=_interpret_params(interpret),
  )
  return call(ids, num, blk, steps, full, layout.row_src_BGL, layout.row_seg_BGL,
              layout.row_pos_BGL, q_BSD, k_BTKD, v_BTKD, segment_ids_BT.astype(jnp.int32))
