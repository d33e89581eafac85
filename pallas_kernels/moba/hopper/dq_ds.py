"""dq from the dS that the dk/dv kernel stored (moba_dkv(store_ds=True)): dq = scale * dS K per
item of ITEM_ROWS sorted rows, one product per 64-key step - the backward's S and dP computed
once, where the dq kernel of rows.py computes them a second time. MobaBlockSizes'
dq_from_stored_ds chooses this path.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.moba.hopper.common import (_await_last_frees, _grid, ITEM_ROWS,
                                               _persistent_call, _ROWS, _slots,
                                               _smem_transforms, _trips)
from pallas_kernels.moba.hopper.dkv import dkv_chunk_steps
from pallas_kernels.moba.hopper.streams import persistent_items


def stored_key_halves(layout, segment_ids_BT, *, block_size: int, chunk: int, group_heads: int):
  """int32 [B * G * I, 2]: per work item (persistent_items' flat ids) and 64-row half, how many
  of its block's 64-key halves, from the first, hold dS that moba_dkv stored for the half's
  rows: those whose chunk steps (`chunk` rows, dkv_chunk_steps) start at or before the
  half's. The halves after them hold only own-block rows' pairs with later keys, all masked:
  dk/dv skipped them and left their dS unwritten."""
  first_BGnW, _ = dkv_chunk_steps(layout, segment_ids_BT, block_size=block_size, chunk=chunk,
                                  group_heads=group_heads)
  b, g, l = layout.row_src_BGL.shape
  num_blocks = segment_ids_BT.shape[1] // block_size
  first_BGJH = first_BGnW.reshape(b, g, num_blocks, block_size // _ROWS)
  items = l // ITEM_ROWS
  blk_BGI = layout.chunk_block_BGC.reshape(b, g, items, -1)[..., 0]
  first_BGIH = jnp.take_along_axis(first_BGJH, jnp.maximum(blk_BGI, 0)[..., None], axis=2)
  step_IW = (jnp.arange(items)[:, None] * ITEM_ROWS + jnp.arange(2) * _ROWS) // chunk
  written_BGIWH = first_BGIH[:, :, :, None, :] <= step_IW[:, :, None]
  count_BGIW = jnp.cumprod(written_BGIWH, axis=-1).sum(-1)
  return count_BGIW.reshape(-1, 2).astype(jnp.int32)


def _dq_ds_kernel(ids_ref, num_ref, blk_ref, halves_ref, ds_ref, k_ref, dq_ref, scoped, *,
                  sm_scale, block_size, num_groups, items_per_group, grid, stages, interpret):
  """Persistent: CTA c runs the used items c, c + grid, ... A producer warpgroup streams, per
  64-key step of the item's block, dS^T of those keys for the item's two row halves and the
  keys' K (`stages` slots); compute warpgroup w accumulates its half's dq += dS K over the
  steps its half has stored (halves_ref[item, w], a prefix of the block's steps), with dS^T
  read transposed by wgmma, passes the rest on unread, and stores scale * dq (q's dtype)
  through its output tile."""
  ds_smem, k_smem, out_smem, bars = scoped
  full, free = bars
  frees = _slots(free, stages)
  wg = lax.axis_index("wg")
  cta = lax.axis_index("cta")
  trips = _trips(num_ref[0], grid)

  def item_at(s):
    flat = ids_ref[cta + s * grid]
    bg = lax.div(flat, items_per_group)
    steps = jnp.maximum(halves_ref[flat, 0], halves_ref[flat, 1])
    return (lax.div(bg, num_groups), lax.rem(bg, num_groups), lax.rem(flat, items_per_group),
            blk_ref[flat], steps, flat)

  @pl.when(wg == 2)
  def _producer():
    def item_body(s, step):
      b, g, i, j, steps, _ = item_at(s)

      def key_step(h, step):
        slot = lax.rem(step, stages)
        with jax.named_scope("wait_free"):
          plgpu.barrier_wait(free.at[slot])
        keys = pl.ds(h * _ROWS, _ROWS)
        for w in range(2):
          plgpu.copy_gmem_to_smem(ds_ref.at[b, g, keys, pl.ds(i * ITEM_ROWS + w * _ROWS, _ROWS)],
                                  ds_smem.at[slot, w], full.at[slot])
        plgpu.copy_gmem_to_smem(k_ref.at[b, pl.ds(j * block_size + h * _ROWS, _ROWS), g],
                                k_smem.at[slot], full.at[slot])
        return step + 1

      return lax.fori_loop(0, steps, key_step, step)

    lax.fori_loop(0, trips, item_body, jnp.int32(0))
    _await_last_frees(frees)

  @pl.when(wg < 2)
  def _consumer():
    for f in frees:
      plgpu.barrier_arrive(f)
    d = k_smem.shape[-1]

    def wait_full(slot):
      with jax.named_scope("wait_full"):
        plgpu.barrier_wait(full.at[slot])

    def product(acc, slot):
      ds_t = ds_smem.at[slot, wg].transpose((1, 0))  # [rows, keys]
      if interpret:  # the interpreter's wgmma: shared-memory operands into a fresh accumulator
        def fresh(acc_ref):
          plgpu.wgmma(acc_ref, ds_t, k_smem.at[slot])
          return acc_ref[...]

        return acc + pl.run_scoped(fresh, plgpu.ACC(acc.shape, jnp.float32))

      def mma(acc_ref):
        plgpu.wgmma(acc_ref, ds_t, k_smem.at[slot])

      return pl.run_state(mma)(plgpu.ACC.init(acc))

    def item_body(s, step):
      b, g, i, _, steps, flat = item_at(s)
      mine = halves_ref[flat, wg]

      def compute(_, carry):
        acc, step = carry
        slot = lax.rem(step, stages)
        wait_full(slot)
        with jax.named_scope("ds_k"):
          acc = product(acc, slot)
        plgpu.barrier_arrive(free.at[slot])
        return acc, step + 1

      def pass_on(_, step):
        slot = lax.rem(step, stages)
        wait_full(slot)
        plgpu.barrier_arrive(free.at[slot])
        return step + 1

      acc = plgpu.layout_cast(jnp.zeros((_ROWS, d), jnp.float32), plgpu.Layout.WGMMA)
      acc, step = lax.fori_loop(0, mine, compute, (acc, step))
      step = lax.fori_loop(mine, steps, pass_on, step)
      with jax.named_scope("epilogue"):
        out_w = out_smem.at[wg]
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last item's dq has left
        out_w[...] = (acc * sm_scale).astype(out_w.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_w, dq_ref.at[b, g, pl.ds(i * ITEM_ROWS + wg * _ROWS, _ROWS)])
      return step

    lax.fori_loop(0, trips, item_body, jnp.int32(0))
    plgpu.wait_smem_to_gmem(0)


def moba_dq_from_ds(ds_BGKL, layout, k_BTKD, segment_ids_BT, *, block_size: int, chunk: int,
                    group_heads: int, interpret: bool | plgpu.InterpretGPUParams,
                    stages: int = 4, num_ctas: int | None = None):
  """Partial dq [B, G, L, D] (k's dtype) per sorted row, as moba_dq_rows, from dS^T
  [B, G, block_size, L] stored by moba_dkv(store_ds=True, chunk_rows=chunk) on the same layout
  (padded with pad_rows=ITEM_ROWS): dq = dS K / sqrt(D) over the keys of each row's block.
  group_heads: query heads per KV group. stages: the (dS, K) pipeline depth. Rows of unused
  items are not written."""
  b, g, l = layout.row_src_BGL.shape
  d = k_BTKD.shape[-1]
  if ds_BGKL.shape != (b, g, block_size, l):
    raise ValueError(f"ds_BGKL must be [B, G, block_size, L] = {(b, g, block_size, l)}, got "
                     f"{ds_BGKL.shape}")
  if stages < 2:
    raise ValueError(f"the dS/K stream needs at least two stages, got {stages}")
  ids, num, blk, _, _ = persistent_items(layout, segment_ids_BT, block_size=block_size,
                                         block_kv=min(128, block_size))
  halves = stored_key_halves(layout, segment_ids_BT, block_size=block_size, chunk=chunk,
                             group_heads=group_heads)
  num_ctas = _grid(num_ctas, interpret)
  dt = k_BTKD.dtype
  transforms = _smem_transforms(dt)
  kernel = functools.partial(_dq_ds_kernel, sm_scale=1.0 / math.sqrt(d), block_size=block_size,
                             num_groups=g, items_per_group=l // ITEM_ROWS, grid=num_ctas,
                             stages=stages, interpret=bool(interpret))

  def entry(*refs):
    scratch = (plgpu.SMEM((stages, 2, _ROWS, _ROWS), dt, transforms=transforms),
               plgpu.SMEM((stages, _ROWS, d), dt, transforms=transforms),
               plgpu.SMEM((2, _ROWS, d), dt, transforms=transforms),
               (plgpu.Barrier(num_arrivals=3, num_barriers=stages),
                plgpu.Barrier(num_arrivals=2, num_barriers=stages)))
    pl.run_scoped(lambda scoped: kernel(*refs, scoped), scratch, collective_axes="wg")

  call = _persistent_call(entry, jax.ShapeDtypeStruct((b, g, l, d), dt), name="moba_dq_ds_hopper",
                          num_ctas=num_ctas, warpgroups=3, interpret=interpret)
  return call(ids, num, blk, halves, ds_BGKL, k_BTKD)
