"""Pallas Mosaic GPU (Hopper: TMA + wgmma) forward kernel on the KV-centric layout.

Same contract as `kernels.moba_forward_rows` (partial output and natural-log lse per
sorted row), so the combine in attention.py does not change. What differs:

* The chunk's query rows are gathered into a contiguous [B, G, L, D] array before the
  kernel (one XLA gather), because the Hopper bulk-copy engine (TMA) copies boxes,
  not row lists; the Triton kernel gathers rows itself with pointer loads.
* One CTA per chunk of `block_rows` = 64 sorted rows (one warpgroup: the M of wgmma
  is 64). Its key tiles stream through a TMA pipeline (`plgpu.emit_pipeline`) of
  `block_k`-key tiles of the chunk's one KV block; QK^T and PV run on wgmma, the
  online softmax in registers, P staged through shared memory.
* The pipeline's trip count is data (`steps_BGC`, computed outside): own-block
  chunks stop after their last query's tile, as the Triton kernel does.

bf16 only (wgmma's 16-bit path); float32 inputs stay on the Triton kernels.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

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
  if bs.block_k % 64:
    raise ValueError(f"the Mosaic GPU kernel needs MobaBlockSizes.block_k % 64 == 0, got "
                     f"{bs.block_k}")


def chunk_key_steps(layout, *, block_size: int, block_k: int) -> jax.Array:
  """int32 [B, G, C]: key tiles each chunk reads; own-block chunks end at their last
  query's tile (later keys are causally masked), others read the whole block."""
  b, g, l = layout.row_pos_BGL.shape
  c = layout.chunk_block_BGC.shape[-1]
  pos_BGCR = jnp.where(layout.row_seg_BGL != 0, layout.row_pos_BGL, 0).reshape(b, g, c, l // c)
  last_BGC = pos_BGCR.max(-1) - jnp.maximum(layout.chunk_block_BGC, 0) * block_size
  return jnp.clip(last_BGC // block_k + 1, 1, block_size // block_k).astype(jnp.int32)


def _fwd_kernel(cb_ref, steps_ref, seg_ref, pos_ref, qs_ref, k_ref, v_ref, kseg_ref, o_ref,
                lse_ref, q_smem, p_smem, o_smem, lse_smem, q_barrier, *, sm_scale, block_size,
                block_k, max_concurrent_steps):
  c = lax.axis_index("chunk")
  g = lax.axis_index("group")
  b = lax.axis_index("row")
  j = cb_ref[b, g, c]
  rows = pl.ds(c * _ROWS, _ROWS)

  @pl.when(j >= 0)
  def _():
    plgpu.copy_gmem_to_smem(qs_ref.at[b, g, rows], q_smem, q_barrier)
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    # Plain (not TMA) loads straight from global memory into the row layout; the
    # vectors are small and read once per chunk.
    seg_R = plgpu.load(seg_ref.at[b, g, rows], layout=row_layout, optimized=False)
    pos_R = plgpu.load(pos_ref.at[b, g, rows], layout=row_layout, optimized=False)
    base = j * block_size
    tiles_per_block = block_size // block_k
    d = q_smem.shape[-1]
    shape = (_ROWS, block_k)
    seg_RK = lax.broadcast_in_dim(seg_R, shape, [0])
    pos_RK = lax.broadcast_in_dim(pos_R, shape, [0])
    plgpu.barrier_wait(q_barrier)

    def body(idx, k_smem, v_smem, carry):
      acc, m_prev, l_prev = carry
      (i,) = idx
      start = base + i * block_k

      def qk(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
        return acc_ref[...]

      s = pl.run_scoped(qk, plgpu.ACC(shape, jnp.float32)) * (sm_scale * _LOG2E)
      kseg_K = plgpu.load(kseg_ref.at[b, pl.ds(start, block_k)],
                          layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)
      kpos_RK = start + plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
      keep = ((seg_RK == lax.broadcast_in_dim(kseg_K, shape, [1])) & (seg_RK != 0)
              & (kpos_RK <= pos_RK))
      s = jnp.where(keep, s, _MASK)
      m_next = jnp.maximum(m_prev, s.max(axis=1))
      corr = jnp.exp2(m_prev - m_next)
      p = jnp.exp2(s - lax.broadcast_in_dim(m_next, shape, [0]))
      l_next = l_prev * corr + p.sum(axis=1)
      # P goes through shared memory (a wgmma operand from registers does not run in
      # the interpreter, and CI checks this kernel there), and PV into a fresh
      # accumulator that is added to the rescaled running sum.
      p_smem[...] = p.astype(p_smem.dtype)
      plgpu.commit_smem()

      def pv(acc_ref):
        plgpu.wgmma(acc_ref, p_smem, v_smem)
        return acc_ref[...]

      pv_RD = pl.run_scoped(pv, plgpu.ACC(acc.shape, jnp.float32))
      acc = acc * lax.broadcast_in_dim(corr, acc.shape, [0]) + pv_RD
      return acc, m_next, l_next

    transforms = _smem_transforms(q_smem.dtype)
    kv_spec = plgpu.BlockSpec((block_k, d), lambda i: (j * tiles_per_block + i, 0),
                              transforms=transforms)
    init = (plgpu.layout_cast(jnp.zeros((_ROWS, d), jnp.float32), plgpu.Layout.WGMMA),
            plgpu.layout_cast(jnp.full((_ROWS,), _MASK, jnp.float32), row_layout),
            plgpu.layout_cast(jnp.zeros((_ROWS,), jnp.float32), row_layout))
    acc, m, l = plgpu.emit_pipeline(
        body, grid=(steps_ref[b, g, c],), in_specs=[kv_spec, kv_spec],
        max_concurrent_steps=max_concurrent_steps, init_carry=init,
    )(k_ref.at[b, :, g], v_ref.at[b, :, g])
    o_smem[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(o_smem.dtype)
    lse_smem[...] = (m + jnp.log2(l)) / _LOG2E  # natural-log lse
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref.at[b, g, rows])
    plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, g, rows])
    plgpu.wait_smem_to_gmem(0)


def moba_forward_rows(q_BSD, layout, k_BTKD, v_BTKD, segment_ids_BT, *, block_size,
                      bs: MobaBlockSizes, interpret: bool):
  """Partial output [B, G, L, D] (q dtype) and natural-log lse [B, G, L] per sorted row,
  as kernels.moba_forward_rows; q_BSD is q reshaped to [B, T * Hq, D]."""
  b, s, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  check_supported(q_BSD.dtype, d, bs)
  # Rows no chunk reads (unused chunks) are never written: callers read only used rows.
  qs_BGLD = jnp.take_along_axis(q_BSD[:, None], layout.row_src_BGL[..., None], axis=2)
  steps_BGC = chunk_key_steps(layout, block_size=block_size, block_k=bs.block_k)
  kernel = functools.partial(_fwd_kernel, sm_scale=1.0 / math.sqrt(d), block_size=block_size,
                             block_k=bs.block_k,
                             max_concurrent_steps=min(bs.num_stages, block_size // bs.block_k))
  transforms = _smem_transforms(q_BSD.dtype)
  call = plgpu.kernel(
      kernel,
      out_type=[jax.ShapeDtypeStruct((b, g, l, d), q_BSD.dtype),
                jax.ShapeDtypeStruct((b, g, l), jnp.float32)],
      scratch_types=[plgpu.SMEM((_ROWS, d), q_BSD.dtype, transforms=transforms),
                     plgpu.SMEM((_ROWS, bs.block_k), q_BSD.dtype, transforms=transforms),
                     plgpu.SMEM((_ROWS, d), q_BSD.dtype, transforms=transforms),
                     plgpu.SMEM((_ROWS,), jnp.float32),
                     plgpu.Barrier()],
      grid=(l // _ROWS, g, b),
      grid_names=("chunk", "group", "row"),
      compiler_params=plgpu.CompilerParams(approx_math=True),
      interpret=plgpu.InterpretGPUParams() if interpret else False,
  )
  return call(layout.chunk_block_BGC, steps_BGC, layout.row_seg_BGL, layout.row_pos_BGL,
              qs_BGLD, k_BTKD, v_BTKD, segment_ids_BT.astype(jnp.int32))
