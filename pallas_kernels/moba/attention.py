"""`moba_attention`: gating, layout, Pallas kernels and their `custom_vjp`.

Owns the public entry, the choice of kernel set (BACKENDS) and the glue between
the kernels: combining the per-slot partial results of every token (the kernels
reach their query rows through the layout's row_src) - a log-sum-exp merge of the
partial outputs in the forward pass, a sum of the partial dq in the backward pass.
Selection is not differentiated (top-k is piecewise constant), as in MoBA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.layout import Layout, with_layout_constraint

from pallas_kernels.moba import gating, hopper, kernels, kv_layout
from pallas_kernels.moba.kernels import MobaBlockSizes


def _from_entries(x_BGLX, layout: kv_layout.MobaKVLayout, group_size: int) -> jax.Array:
  """[B, G, L, X...] -> [B, G, T, K, Gh, X...]: each (token, slot, head)'s sorted row."""
  rows_BGTKH = layout.entry_row_BGTK[..., None] + jnp.arange(group_size, dtype=jnp.int32)
  b, g = rows_BGTKH.shape[:2]
  flat = rows_BGTKH.reshape(b, g, -1)
  rest = x_BGLX.shape[3:]
  idx = jnp.minimum(flat, x_BGLX.shape[2] - 1).reshape(b, g, -1, *([1] * len(rest)))
  out = jnp.take_along_axis(x_BGLX, idx, axis=2, mode="promise_in_bounds")
  return out.reshape(*rows_BGTKH.shape, *rest)


def _group_to_BTH(x_BGTGh, b, t, hq):
  """[B, G, T, Gh, X...] -> [B, T, Hq, X...]."""
  rest = x_BGTGh.shape[4:]
  return jnp.moveaxis(x_BGTGh, 1, 2).reshape(b, t, hq, *rest)


# The per-slot partial results are merged by XLA (one fused gather of every slot, masked)
# below this k_max, by kernels.merge_partials (a loop over each token's used slots only) from
# it. H200, S=32K, 16 x 128, top-3, forward + dq merges: XLA 0.279 ms at k_max 3 and 0.620 at
# k_max 16, the kernel 0.383 at both (64-token tiles; BENCHMARKS.md); 8 lies between the two
# measurements (XLA's cost interpolated to about 0.41 ms there), not measured itself.
_SLOT_MERGE_MIN_K_MAX = 8


def _merge(part_BGLD, lse_BGL, sel, layout, ok_B, group_size, interpret):
  """merge_partials' contract (out and lse with lse_BGL, else the sum), by XLA or the kernel
  as _SLOT_MERGE_MIN_K_MAX says."""
  if layout.entry_row_BGTK.shape[3] >= _SLOT_MERGE_MIN_K_MAX:
    return kernels.merge_partials(part_BGLD, lse_BGL, layout.entry_row_BGTK, sel.count_BTG,
                                  ok_B, group_size=group_size, interpret=bool(interpret))
  return xla_merge(part_BGLD, lse_BGL, sel, layout, ok_B, group_size)


def _exact_if_f32(dtype):
  """The glue's float32 contractions in full float32 where the inputs are float32 (a GPU's
  default for them is tf32); left to XLA for bf16 inputs, as measured."""
  return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def xla_merge(part_BGLD, lse_BGL, sel, layout, ok_B, group_size):
  """merge_partials' contract by XLA: one fused gather of every slot, masked."""
  b, g, l, _ = part_BGLD.shape
  t = layout.entry_row_BGTK.shape[2]
  hq = g * group_size
  num_blocks = layout.block_chunks_BGN2.shape[2]
  used_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3)) < num_blocks
  # Unused slots point at rows no kernel wrote: select, never multiply by zero.
  part_BGTKHD = jnp.where(used_BGTK[..., None, None],
                          _from_entries(part_BGLD, layout, group_size).astype(jnp.float32), 0.0)
  if lse_BGL is None:
    return _group_to_BTH(part_BGTKHD.sum(axis=3), b, t, hq).astype(part_BGLD.dtype)
  lse_BGTKH = jnp.where(used_BGTK[..., None], _from_entries(lse_BGL, layout, group_size),
                        -jnp.inf)
  any_BGTH = jnp.broadcast_to(used_BGTK.any(-1)[..., None], lse_BGTKH.shape[:3] + (group_size,))
  mx_BGTH = jnp.where(any_BGTH, lse_BGTKH.max(axis=3), 0.0)
  w_BGTKH = jnp.where(used_BGTK[..., None], jnp.exp(lse_BGTKH - mx_BGTH[:, :, :, None, :]), 0.0)
  denom_BGTH = jnp.maximum(w_BGTKH.sum(axis=3), 1e-30)
  o_BGTHD = jnp.einsum("bgtkh,bgtkhd->bgthd", w_BGTKH, part_BGTKHD,
                       precision=_exact_if_f32(part_BGLD.dtype)) / denom_BGTH[..., None]
  o_BGTHD = jnp.where(ok_B[:, None, None, None, None], o_BGTHD, jnp.nan)
  lse_BGTH = jnp.where(any_BGTH, mx_BGTH + jnp.log(denom_BGTH), 0.0)
  return (_group_to_BTH(o_BGTHD, b, t, hq).astype(part_BGLD.dtype),
          _group_to_BTH(lse_BGTH, b, t, hq))


# Kernel sets: each module provides moba_forward_rows, moba_dq_rows and moba_dkv with the same
# contracts. "triton": Pallas Triton lowering, any GPU, float32 or bf16; "mosaic": Pallas
# Mosaic GPU, Hopper, bf16 (the hopper package).
BACKENDS = {"triton": kernels, "mosaic": hopper}
# Rows each block's run is padded to, where a kernel set needs more than block_rows.
_PAD_ROWS = {"mosaic": hopper.ITEM_ROWS}
# Kernel sets whose backward kernels read q and dO rows in sorted order: their forward also
# returns q's (sorted_q=True), and their dq kernel gathers dO's and returns them sorted too
# (sorted_do=True), for dk/dv (q_rows=, do_rows=). The residual is then q's sorted rows in
# place of q: about k_max times q's size (plus run padding), the buffer the backward would
# otherwise gather anyway. Under the model's per-layer remat it lives only inside a layer's
# backward, unless the layer keeps its attention results (model.remat_keep): then it is
# held from the forward pass to the backward, with the layout (the GPU preset: ~8.8 GB more
# memory over its 24 layers, BENCHMARKS.md).
_SORTED_ROWS = {"mosaic"}


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _moba_core(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, ok_B, sel, layout, block_size, bs,
               interpret, backend):
  out, _ = _forward(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, ok_B, sel, layout, block_size, bs,
                    interpret, backend, for_backward=False)
  return out


def _moba_fwd(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, ok_B, sel, layout, block_size, bs,
              interpret, backend):
  return _forward(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, ok_B, sel, layout, block_size, bs,
                  interpret, backend, for_backward=True)


def _forward(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, ok_B, sel, layout, block_size, bs,
             interpret, backend, *, for_backward):
  """Output and the backward's residuals (for_backward: with q's sorted rows, _SORTED_ROWS)."""
  b, t, hq, d = q_BTHD.shape
  hkv = k_BTKD.shape[2]
  gh = hq // hkv
  o_BGLD, lse_BGL, *q_rows = BACKENDS[backend].moba_forward_rows(
      q_BTHD.reshape(b, t * hq, d), layout, k_BTKD, v_BTKD, segment_ids_BT,
      block_size=block_size, bs=bs, interpret=interpret,
      **({"sorted_q": True} if for_backward and backend in _SORTED_ROWS else {}))
  # Rows whose budget is out of range come out NaN.
  out_BTHD, lse_BTH = _merge(o_BGLD, lse_BGL, sel, layout, ok_B, gh, interpret)
  # q itself, or (_SORTED_ROWS) its rows in sorted order.
  q_saved = q_rows[0] if q_rows else q_BTHD
  res = (q_saved, k_BTKD, v_BTKD, segment_ids_BT, sel, layout, out_BTHD, lse_BTH)
  return out_BTHD, res


def _moba_bwd(block_size, bs, interpret, backend, res, do_BTHD):
  q_saved, k_BTKD, v_BTKD, segment_ids_BT, sel, layout, out_BTHD, lse_BTH = res
  b, t, hq, d = out_BTHD.shape
  hkv = k_BTKD.shape[2]
  gh = hq // hkv
  do_BTHD = do_BTHD.astype(out_BTHD.dtype)
  delta_BTH = jnp.einsum("bthd,bthd->bth", out_BTHD.astype(jnp.float32),
                         do_BTHD.astype(jnp.float32), precision=_exact_if_f32(out_BTHD.dtype))
  flat = lambda x: x.reshape(b, t * hq, *x.shape[3:])
  rows = (flat(lse_BTH), flat(delta_BTH), layout, k_BTKD, v_BTKD, segment_ids_BT)
  common = dict(block_size=block_size, bs=bs, interpret=interpret)
  kernel_set = BACKENDS[backend]
  if backend in _SORTED_ROWS:
    dq_BGLD, do_rows = kernel_set.moba_dq_rows(None, flat(do_BTHD), *rows, q_rows=q_saved,
                                               sorted_do=True, **common)
    dk_BTKD, dv_BTKD = kernel_set.moba_dkv(None, None, *rows, q_rows=q_saved,
                                           do_rows=do_rows, **common)
  else:
    dq_BGLD = kernel_set.moba_dq_rows(flat(q_saved), flat(do_BTHD), *rows, **common)
    dk_BTKD, dv_BTKD = kernel_set.moba_dkv(flat(q_saved), flat(do_BTHD), *rows, **common)
  dq_BTHD = _merge(dq_BGLD, None, sel, layout, None, gh, interpret).astype(out_BTHD.dtype)
  # dq leaves the merge row-major. Left free, XLA lays it out for its consumer; in the model's
  # unrolled layers that is the qkv projection's backward, wanting [.., H, D, T], and it then
  # fuses the merge into a row reduction over the few slots (BENCHMARKS.md, model.scan_layers).
  dq_BTHD = with_layout_constraint(dq_BTHD, Layout(major_to_minor=tuple(range(dq_BTHD.ndim))))
  return dq_BTHD, dk_BTKD, dv_BTKD, None, None, None, None


_moba_core.defvjp(_moba_fwd, _moba_bwd)


# Whether the layout ranks by kv_layout.tile_read_ranks' kernel where it fits (else by the
# running count of kv_layout._read_ranks, XLA only). The same layout either way (tested); off:
# on the H200 the step at 16/16 x 128, S=32K, block 512, top-3 ran 0.117 ms slower with it
# (BENCHMARKS.md, "The layout's ranks by a tile kernel").
_TILE_RANKS = False


def layout_tile_ranks(num_tokens: int, k_max: int) -> bool:
  """Whether gate_and_layout's layout ranks by kv_layout.tile_read_ranks (_TILE_RANKS, where
  the kernel takes the shape): build_kv_layout's tile_ranks for callers that build the same
  layout."""
  return _TILE_RANKS and kv_layout.tile_ranks_fit(num_tokens, k_max)


def gate_and_layout(q_BTHD, k_BTKD, segment_ids_BT, budget_B, *, block_size: int, k_max: int,
                    bs: MobaBlockSizes, interpret: bool, backend: str = "triton"
                    ) -> tuple[gating.MobaSelection, kv_layout.MobaKVLayout]:
  """The gating moba_attention runs before its kernels: the fused gate's selection and the
  KV-centric layout for the tiles of `bs` (fitted here, as the kernels fit it) and the
  backend's padding."""
  bs = bs.fit(block_size, q_BTHD.shape[-1])
  segment_ids_BT = segment_ids_BT.astype(jnp.int32)
  sel = gating.fused_gate(lax.stop_gradient(q_BTHD), lax.stop_gradient(k_BTKD), segment_ids_BT,
                          budget_B.astype(jnp.int32), block_size=block_size, k_max=k_max,
                          interpret=interpret)
  layout = kv_layout.build_kv_layout(
      sel, segment_ids_BT, num_blocks=q_BTHD.shape[1] // block_size,
      group_size=q_BTHD.shape[2] // k_BTKD.shape[2], block_rows=bs.block_rows,
      mark_full=bs.skip_full_masks, pad_rows=_PAD_ROWS.get(backend),
      tile_ranks=layout_tile_ranks(q_BTHD.shape[1], k_max),
      interpret=bool(interpret))
  return sel, layout


def moba_attention(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *, block_size: int,
                   k_max: int, block_sizes: MobaBlockSizes | None = None,
                   backend: str = "triton", interpret: bool = False) -> jax.Array:
  """MoBA attention (see the package docstring for the exact semantics).

  backend: the kernel set for the forward, dq and dk/dv: "triton" (Pallas Triton lowering,
  any GPU, float32 or bf16) or "mosaic" (Pallas Mosaic GPU, Hopper, bf16, block_size a
  multiple of 128; the hopper package).
  """
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {sorted(BACKENDS)}")
  gating.validate_shapes(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B,
                         block_size=block_size, k_max=k_max)
  if k_BTKD.dtype != q_BTHD.dtype or v_BTKD.dtype != q_BTHD.dtype:
    raise ValueError(f"q_BTHD, k_BTKD, v_BTKD must share a dtype, got {q_BTHD.dtype}, "
                     f"{k_BTKD.dtype}, {v_BTKD.dtype}")
  bs = (block_sizes or MobaBlockSizes()).fit(block_size, q_BTHD.shape[-1])
  bs.check(block_size)
  if backend == "mosaic":
    hopper.check_supported(q_BTHD.dtype, q_BTHD.shape[-1], bs, block_size)
    hopper.check_device(interpret)
  segment_ids_BT = segment_ids_BT.astype(jnp.int32)
  ok_B = gating.check_budget(budget_B, k_max=k_max)
  sel, layout = gate_and_layout(q_BTHD, k_BTKD, segment_ids_BT, budget_B, block_size=block_size,
                                k_max=k_max, bs=bs, interpret=interpret, backend=backend)
  return _moba_core(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, ok_B, sel, layout, block_size, bs,
                    interpret, backend)
