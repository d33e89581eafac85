"""Pallas (Triton lowering) attention kernels on the KV-centric sorted-row layout (the
fused gate kernel that precedes them is gating.py's).

Three attention `pallas_call`s, all reading `MobaKVLayout` (see kv_layout.py):

* forward: one program per (row, KV group, chunk of `block_rows` sorted rows);
  the chunk's rows all read one KV block, so the program streams that block's
  keys in `block_k` tiles with an online softmax and writes a partial output and
  its log-sum-exp per sorted row. Unused chunks return at once.
* dq: same grid; per sorted row the partial dq against its one block.
* dk/dv: one program per (row, KV group, `block_k_dkv` key tile); it loops over
  the chunks that read the tile's block - `[first, end)` read from the layout, so
  the trip count is data and falls with the budget - accumulating dk and dv.

Masking inside a block: same segment (non-zero) and key position <= query
position (only binds in the own block). Partial results are combined outside
the kernels (attention.py), from a large k_max by `merge_partials`.

Two more: `gather_rows` puts a per-token array's rows into sorted order (for the Hopper
backward kernels when they are called without rows already sorted; in moba_attention the
forward stores q's and dq dO's), and `merge_partials` combines each token's per-slot
partial results reading only its used slots.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_MASK = -0.7 * float(jnp.finfo(jnp.float32).max)
_LOG2E = math.log2(math.e)


def _dot(a, b, **kwargs):
  """plgpu.dot, float32 operands multiplied in IEEE float32 (the Triton lowering's default for
  them is tf32, ~1e-3 relative, where the float32 path is the exact one); bf16 unchanged."""
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return plgpu.dot(a, b, precision=precision, **kwargs)


@dataclasses.dataclass(frozen=True)
class MobaBlockSizes:
  """Tile sizes and Triton launch parameters (all tiles powers of two).

  block_rows: sorted query rows per chunk (the M of every matmul).
  block_k: key tile of the forward and dq loops.
  block_k_dkv: key tile per dk/dv program (its rows step by block_rows: the loop steps over
    the layout's chunks).
  """

  block_rows: int = 64
  block_k: int = 64
  block_k_dkv: int = 64
  num_warps: int = 4
  num_stages: int = 2
  num_warps_bwd: int = 4
  num_stages_bwd: int = 2
  # Run chunks the layout marks full (every pair attended: chunk_full_BGC) without the
  # per-element mask, in a second copy of each loop. None: on for head_dim <= 64, where the
  # mask is a larger share of a tile's work (H200, 14/2 heads x 64, block 256: fwd+bwd 4-9%
  # faster at k = 8 and 16 in three runs), off above (16/16 x 128, block 512: 1-4% slower).
  skip_full_masks: bool | None = None
  # Softmax exponentials as PTX ex2.approx.ftz. The Triton lowering calls libdevice's exp2f
  # for jnp.exp2: ex2.approx without flush-to-zero, with subnormals handled around the
  # instruction. Compiled kernels only: interpret mode runs jnp.exp2.
  # H200, same process: fwd+bwd 1.9-2.6% faster at 16/16 x 128 (k = 3, 8, 16), 0.8-1.1%
  # slower at 14/2 x 64 (k = 8, 16; one run, inside the noise).
  fast_exp2: bool = True
  # Hopper dk/dv only: split a key tile whose run is longer than its per-CTA share into parts
  # (hopper.dkv_items). None: on for head_dim <= 64 (H200, 14/2 x 64, block 512, top-3: the
  # model's train step 3% faster, its dk/dv 36%; random inputs: kernels 2.545 ms without,
  # 2.497 with, two sessions), off above (16/16 x 128, random inputs, no tile split: the
  # step's kernels 2.6% slower, dk/dv +0.027 ms and the parts' glue ~0.07 ms; BENCHMARKS.md).
  split_dkv_runs: bool | None = None

  def check(self, block_size: int) -> None:
    for name in ("block_rows", "block_k", "block_k_dkv"):
      v = getattr(self, name)
      if v >= 16 and not v & (v - 1):
        continue
      if name != "block_rows" and v == block_size:
        # fit() shrank the tile to a block smaller than it: the block size is what is wrong.
        raise ValueError(f"block_size={block_size} must be a power of two >= 16, or a "
                         f"multiple of the key tiles (MobaBlockSizes.{name})")
      raise ValueError(f"MobaBlockSizes.{name}={v} must be a power of two >= 16")
    for name in ("num_warps", "num_stages", "num_warps_bwd", "num_stages_bwd"):
      if getattr(self, name) < 1:
        raise ValueError(f"MobaBlockSizes.{name}={getattr(self, name)} must be >= 1")
    for name in ("block_k", "block_k_dkv"):
      if block_size % getattr(self, name):
        raise ValueError(f"block_size={block_size} must be a multiple of "
                         f"MobaBlockSizes.{name}={getattr(self, name)}")

  def fit(self, block_size: int, head_dim: int) -> "MobaBlockSizes":
    """Shrinks the key tiles to block_size when a block is smaller than a tile, and decides
    skip_full_masks and split_dkv_runs where they are None (by head_dim)."""
    skip = head_dim <= 64 if self.skip_full_masks is None else bool(self.skip_full_masks)
    split = head_dim <= 64 if self.split_dkv_runs is None else bool(self.split_dkv_runs)
    return dataclasses.replace(self, block_k=min(self.block_k, block_size),
                               block_k_dkv=min(self.block_k_dkv, block_size),
                               skip_full_masks=skip, split_dkv_runs=split)


def _exp2(x, fast: bool):
  """2**x in float32. fast: ex2.approx.ftz.f32 (relative error ~2^-22; results below 2^-126
  flush to 0, which a softmax cannot tell from underflow)."""
  if not fast:
    return jnp.exp2(x)
  (y,) = plgpu.elementwise_inline_asm(
      "ex2.approx.ftz.f32 $0, $1;", args=[x], constraints="=f,f", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)])
  return y


def _mask(seg_R, pos_R, kseg_K, kpos_K):
  return ((seg_R[:, None] == kseg_K[None, :]) & (seg_R[:, None] != 0)
          & (kpos_K[None, :] <= pos_R[:, None]))


def _num_key_tiles(pos_R, base, block_size, block_k):
  """Key tiles a chunk can see: own-block chunks stop after their last query's
  position (later tiles are causally masked); padding rows carry position T."""
  return jnp.minimum(block_size // block_k, (jnp.max(pos_R) - base) // block_k + 1)


def _masked_or_full(full, run, init, skip_full_masks: bool):
  """run(masked=True)(init), or where the chunk is full and skipping is on, the unmasked copy."""
  if not isinstance(skip_full_masks, bool):  # None must have been decided by MobaBlockSizes.fit
    raise TypeError(f"skip_full_masks={skip_full_masks!r}: call MobaBlockSizes.fit first")
  if not skip_full_masks:
    return run(True)(init)
  return lax.cond(full != 0, run(False), run(True), init)


def _fwd_kernel(cb_ref, full_ref, src_ref, seg_ref, pos_ref, q_ref, k_ref, v_ref, kseg_ref, o_ref,
                lse_ref, *, sm_scale, block_size, block_k, skip_full_masks, fast_exp2):
  j = cb_ref[0]

  @pl.when(j >= 0)
  def _():
    r, d = o_ref.shape
    q = q_ref[src_ref[...]]  # gather the chunk's (token, head) rows
    seg, pos = seg_ref[...], pos_ref[...]
    base = j * block_size

    n_tiles = _num_key_tiles(pos, base, block_size, block_k)

    def run(masked):
      def body(i, carry):
        acc, m_prev, l_prev = carry
        ks = pl.ds(base + i * block_k, block_k)
        k = k_ref[ks, :]
        s = _dot(q, k, trans_b=True) * (sm_scale * _LOG2E)
        if masked:
          kpos = base + i * block_k + jnp.arange(block_k, dtype=jnp.int32)
          s = jnp.where(_mask(seg, pos, kseg_ref[ks], kpos), s, _MASK)
        m_next = jnp.maximum(m_prev, s.max(axis=-1))
        corr = jnp.exp2(m_prev - m_next)
        p = _exp2(s - m_next[:, None], fast_exp2)
        l_next = l_prev * corr + p.sum(axis=-1)
        v = v_ref[ks, :]
        acc = acc * corr[:, None] + _dot(p.astype(v.dtype), v)
        return acc, m_next, l_next
      return lambda init: lax.fori_loop(0, n_tiles, body, init)

    init = (jnp.zeros((r, d), jnp.float32), jnp.full((r,), _MASK, jnp.float32),
            jnp.zeros((r,), jnp.float32))
    acc, m, l = _masked_or_full(full_ref[0], run, init, skip_full_masks)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = (m + jnp.log2(l)) / _LOG2E  # natural-log lse


def _dq_kernel(cb_ref, full_ref, src_ref, seg_ref, pos_ref, q_ref, do_ref, lse_ref, delta_ref,
               k_ref, v_ref, kseg_ref, dq_ref, *, sm_scale, block_size, block_k, skip_full_masks,
               fast_exp2):
  j = cb_ref[0]

  @pl.when(j >= 0)
  def _():
    r, d = dq_ref.shape
    src = src_ref[...]
    q, do = q_ref[src], do_ref[src]
    lse2, delta = lse_ref[src] * _LOG2E, delta_ref[src]
    seg, pos = seg_ref[...], pos_ref[...]
    base = j * block_size

    n_tiles = _num_key_tiles(pos, base, block_size, block_k)

    def run(masked):
      def body(i, dq):
        ks = pl.ds(base + i * block_k, block_k)
        k, v = k_ref[ks, :], v_ref[ks, :]
        s = _dot(q, k, trans_b=True) * (sm_scale * _LOG2E)
        p = _exp2(s - lse2[:, None], fast_exp2)
        if masked:
          kpos = base + i * block_k + jnp.arange(block_k, dtype=jnp.int32)
          p = jnp.where(_mask(seg, pos, kseg_ref[ks], kpos), p, 0.0)
        dp = _dot(do, v, trans_b=True)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)
      return lambda init: lax.fori_loop(0, n_tiles, body, init)

    dq = _masked_or_full(full_ref[0], run, jnp.zeros((r, d), jnp.float32), skip_full_masks)
    dq_ref[...] = (dq * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(bc_ref, skip_ref, full_ref, src_ref, seg_ref, pos_ref, q_ref, do_ref, lse_ref,
                delta_ref, k_ref, v_ref, kseg_ref, dk_ref, dv_ref, *, sm_scale, block_k, block_rows,
                group_size, skip_full_masks, fast_exp2):
  # A block's run starts with its own tokens' rows in position order; the chunks
  # holding only own rows before this key tile are causally masked: skip them.
  first = bc_ref[0] + (skip_ref[0] * group_size) // block_rows
  end = bc_ref[1]
  k, v = k_ref[...], v_ref[...]
  kseg = kseg_ref[...]
  kpos = pl.program_id(2) * block_k + jnp.arange(block_k, dtype=jnp.int32)

  def body(c, carry):
    dk, dv = carry
    rs = pl.ds(c * block_rows, block_rows)
    src = src_ref[rs]
    q, do = q_ref[src], do_ref[src]
    lse, delta = lse_ref[src], delta_ref[src]
    s = _dot(q, k, trans_b=True) * (sm_scale * _LOG2E)

    def run(masked):
      if not masked:
        return lambda p: p
      return lambda p: jnp.where(_mask(seg_ref[rs], pos_ref[rs], kseg, kpos), p, 0.0)

    p = _exp2(s - lse[:, None] * _LOG2E, fast_exp2)
    p = _masked_or_full(full_ref[c], run, p, skip_full_masks)
    dv = dv + _dot(p.astype(do.dtype), do, trans_a=True)
    dp = _dot(do, v, trans_b=True)
    ds = p * (dp - delta[:, None])
    dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
    return dk, dv

  d = k.shape[-1]
  zeros = jnp.zeros((block_k, d), jnp.float32)
  dk, dv = lax.fori_loop(first, end, body, (zeros, zeros))
  dk_ref[...] = (dk * sm_scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _rows_spec(r, d=None):
  if d is None:
    return pl.BlockSpec((None, None, r), lambda b, g, c: (b, g, c))
  return pl.BlockSpec((None, None, r, d), lambda b, g, c: (b, g, c, 0))


def _full_spec(shape):
  """Whole per-row array ([T*Hq, D] queries, [T*Hq] lse, ...) for in-kernel gathers."""
  return pl.BlockSpec((None, *shape), lambda b, g, c: (b,) + (0,) * len(shape))


def _chunk_program(kernel, layout, token_arrays, k_BTKD, v_BTKD, segment_ids_BT, *, block_rows,
                   out_specs, out_shape, num_warps, num_stages, interpret, name):
  """One program per (row, KV group, chunk of block_rows sorted rows). The kernel takes the
  chunk's block id and full flag, its rows' sources / segments / positions, then the whole per-token
  arrays (it gathers its rows from them), K and V (it reads its block's tiles), and the key
  segment ids, followed by its outputs."""
  b, g, l = layout.row_src_BGL.shape
  t, d = k_BTKD.shape[1], k_BTKD.shape[-1]
  r = block_rows
  kv_spec = pl.BlockSpec((None, t, None, d), lambda b_, g_, c: (b_, 0, g_, 0))
  return pl.pallas_call(
      kernel,
      grid=(b, g, l // r),
      in_specs=[_rows_spec(1), _rows_spec(1), _rows_spec(r), _rows_spec(r), _rows_spec(r),
                *(_full_spec(x.shape[1:]) for x in token_arrays), kv_spec, kv_spec,
                _full_spec((t,))],
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name=name,
  )(layout.chunk_block_BGC, layout.chunk_full_BGC, layout.row_src_BGL, layout.row_seg_BGL,
    layout.row_pos_BGL, *token_arrays, k_BTKD, v_BTKD, segment_ids_BT.astype(jnp.int32))


def _gather_kernel(cb_ref, src_ref, x_ref, o_ref):
  @pl.when(cb_ref[0] >= 0)
  def _():
    o_ref[...] = x_ref[src_ref[...]]


def gather_rows(x_BSD, layout, *, run_rows: int, interpret: bool) -> jax.Array:
  """[B, T * Hq, D] -> [B, G, L, D]: each sorted row's value (padding rows: row 0's), as
  hopper.sorted_rows, for the rows of every run of `run_rows` rows whose first chunk is
  used; the rows of other runs are not written. One program per run. On the H200 (dO at
  S=32K, 16 x 128, top-3) it takes 0.205 ms, about 3.9 TB/s of reads and writes, where XLA's
  gather of the same rows took 0.262 ms."""
  b, _, d = x_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  chunk = l // layout.chunk_block_BGC.shape[-1]
  if l % run_rows or run_rows % chunk or layout.run_rows % run_rows:
    raise ValueError(f"run_rows={run_rows} must be a multiple of the layout's chunk "
                     f"({chunk} rows) dividing its {l} rows and its runs' padding "
                     f"({layout.run_rows} rows)")
  per_run = run_rows // chunk
  return pl.pallas_call(
      _gather_kernel,
      grid=(b, g, l // run_rows),
      in_specs=[pl.BlockSpec((None, None, 1), lambda b_, g_, i: (b_, g_, i * per_run)),
                _rows_spec(run_rows), _full_spec(x_BSD.shape[1:])],
      out_specs=_rows_spec(run_rows, d),
      out_shape=jax.ShapeDtypeStruct((b, g, l, d), x_BSD.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
      interpret=interpret,
      name="moba_gather_rows",
  )(layout.chunk_block_BGC, layout.row_src_BGL, x_BSD)


def _merge_kernel(ok_ref, cnt_ref, entry_ref, part_ref, lse_ref, out_ref, *lse_out, group_size):
  """One query head of a tile of tokens: the partial results of its used slots (a prefix of
  count slots per token), read through the slots' sorted rows - log-sum-exp weighted with
  lse_ref (forward), or summed (dq, lse_ref None). Loops to the tile's largest count.

  The forward reads every slot's lse first (one gather of [slots, tokens]) and turns them into
  final weights, so its loop over the slots, like dq's, only loads rows and adds: no running
  maximum and rescale, and no lse load waited on inside the loop."""
  tt, d = out_ref.shape
  kpad = entry_ref.shape[0]
  h = lax.rem(pl.program_id(1), group_size)
  cnt = cnt_ref[...]
  if lse_ref is not None:
    slot_K1 = lax.broadcasted_iota(jnp.int32, (kpad, 1), 0)
    used_KT = slot_K1 < cnt[None, :]
    lse_KT = jnp.where(used_KT, lse_ref[jnp.where(used_KT, entry_ref[...] + h, 0)], -jnp.inf)
    m = jnp.max(lse_KT, axis=0)
    w_KT = jnp.where(used_KT, jnp.exp(lse_KT - jnp.where(cnt > 0, m, 0.0)[None, :]), 0.0)
    l = jnp.sum(w_KT, axis=0)
    w_KT = w_KT / jnp.maximum(l, 1e-30)[None, :]

  def add(s, acc):
    used = s < cnt
    # Unused slots read row 0: select, never multiply a row no kernel wrote.
    rows = jnp.where(used, entry_ref[pl.ds(s, 1), :][0] + h, 0)
    o = jnp.where(used[:, None], part_ref[rows].astype(jnp.float32), 0.0)
    if lse_ref is None:
      return acc + o
    return acc + jnp.sum(jnp.where(slot_K1 == s, w_KT, 0.0), axis=0)[:, None] * o

  acc = lax.fori_loop(0, jnp.max(cnt), add, jnp.zeros((tt, d), jnp.float32))
  if lse_ref is None:
    out_ref[...] = acc.astype(out_ref.dtype)
    return
  ok = ok_ref[0] != 0
  out_ref[...] = jnp.where(ok, acc, jnp.nan).astype(out_ref.dtype)
  lse_out[0][...] = jnp.where(cnt > 0, m + jnp.log(jnp.maximum(l, 1e-30)), 0.0)


def merge_partials(part_BGLD, lse_BGL, entry_row_BGTK, count_BTG, ok_B, *, group_size: int,
                   interpret: bool, block_tokens: int = 16, num_warps: int = 2,
                   num_stages: int = 3):
  """Each (token, query head)'s partial results, combined: [B, T, Hq, D] in part's dtype, and
  with lse_BGL (the forward) the merged natural-log lse [B, T, Hq] float32; with lse_BGL None
  (dq) their sum. A token's used slots are the prefix of count_BTG slots; the slot's rows
  are entry_row_BGTK + head. Only used slots are read, so the cost follows the budget, not
  k_max: on the H200 at top-3 (S=32K, 16 x 128) both merges took 0.383 ms under k_max 3 and
  16 (64-token tiles, 4 warps), where XLA's gather of every slot before masking took 0.279 and
  0.620 ms (attention._SLOT_MERGE_MIN_K_MAX picks between them). ok_B (forward; None: all
  rows): rows whose budget is out of range get NaN outputs. Padding tokens (count 0): 0 and
  lse 0. block_tokens, num_warps, num_stages: a program's tokens (of one query head), its
  warps, and its slot loop's software-pipeline depth; the defaults were the fastest or within
  1% of it of eight configurations at three points on the H200 (experiments/merge_tiles.py;
  the readings, and those of the forward's weights taken before its loop, in BENCHMARKS.md)."""
  b, g, l, d = part_BGLD.shape
  t, kmax = entry_row_BGTK.shape[2:]
  hq = g * group_size
  tt = math.gcd(t, block_tokens)
  kpad = pl.next_power_of_2(kmax)
  entry_BGKT = jnp.pad(jnp.moveaxis(entry_row_BGTK, 3, 2),
                       [(0, 0), (0, 0), (0, kpad - kmax), (0, 0)])
  count_BGT = jnp.moveaxis(count_BTG, 2, 1).astype(jnp.int32)
  gi = lambda h: h // group_size
  forward = lse_BGL is not None
  out_shape = [jax.ShapeDtypeStruct((b, t, hq, d), part_BGLD.dtype)]
  out_specs = [pl.BlockSpec((None, tt, None, d), lambda b_, h, i: (b_, i, h, 0))]
  if forward:
    out_shape.append(jax.ShapeDtypeStruct((b, t, hq), jnp.float32))
    out_specs.append(pl.BlockSpec((None, tt, None), lambda b_, h, i: (b_, i, h)))
  in_specs = [pl.BlockSpec((1,), lambda b_, h, i: (b_,)),
              pl.BlockSpec((None, None, tt), lambda b_, h, i: (b_, gi(h), i)),
              pl.BlockSpec((None, None, kpad, tt), lambda b_, h, i: (b_, gi(h), 0, i)),
              pl.BlockSpec((None, None, l, d), lambda b_, h, i: (b_, gi(h), 0, 0))]
  ok_B = jnp.ones((b,), jnp.int32) if ok_B is None else ok_B.astype(jnp.int32)
  operands = [ok_B, count_BGT, entry_BGKT, part_BGLD]
  if forward:
    in_specs.append(pl.BlockSpec((None, None, l), lambda b_, h, i: (b_, gi(h), 0)))
    operands.append(lse_BGL)

  def kernel(*refs):
    ins, outs = refs[:len(operands)], refs[len(operands):]
    ok, cnt, entry, part, *lse = ins
    _merge_kernel(ok, cnt, entry, part, lse[0] if lse else None, *outs,
                  group_size=group_size)

  res = pl.pallas_call(
      kernel,
      grid=(b, hq, t // tt),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="moba_merge" if forward else "moba_merge_dq",
  )(*operands)
  return tuple(res) if forward else res[0]


def moba_forward_rows(q_BSD, layout, k_BTKD, v_BTKD, segment_ids_BT, *, block_size,
                      bs: MobaBlockSizes, interpret: bool):
  """Partial output [B, G, L, D] (q dtype) and natural-log lse [B, G, L] per sorted row.

  q_BSD is q reshaped to [B, T * Hq, D]; the kernel gathers each chunk's rows."""
  b, _, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  bs = bs.fit(block_size, d)  # as moba_attention does (idempotent)
  r = bs.block_rows
  kernel = functools.partial(_fwd_kernel, sm_scale=1.0 / math.sqrt(d), block_size=block_size,
                             block_k=bs.block_k, skip_full_masks=bs.skip_full_masks,
                             fast_exp2=bs.fast_exp2 and not interpret)
  return _chunk_program(
      kernel, layout, [q_BSD], k_BTKD, v_BTKD, segment_ids_BT, block_rows=r,
      out_specs=[_rows_spec(r, d), _rows_spec(r)],
      out_shape=[jax.ShapeDtypeStruct((b, g, l, d), q_BSD.dtype),
                 jax.ShapeDtypeStruct((b, g, l), jnp.float32)],
      num_warps=bs.num_warps, num_stages=bs.num_stages, interpret=interpret, name="moba_fwd")


def moba_dq_rows(q_BSD, do_BSD, lse_BS, delta_BS, layout, k_BTKD, v_BTKD, segment_ids_BT, *,
                 block_size, bs: MobaBlockSizes, interpret: bool):
  """Partial dq [B, G, L, D] in q's dtype per sorted row (inputs flattened to [B, T * Hq, ...]);
  the k_b partials of a token are summed in float32 outside."""
  b, _, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  bs = bs.fit(block_size, d)  # as moba_attention does (idempotent)
  r = bs.block_rows
  kernel = functools.partial(_dq_kernel, sm_scale=1.0 / math.sqrt(d), block_size=block_size,
                             block_k=bs.block_k, skip_full_masks=bs.skip_full_masks,
                             fast_exp2=bs.fast_exp2 and not interpret)
  return _chunk_program(
      kernel, layout, [q_BSD, do_BSD, lse_BS, delta_BS], k_BTKD, v_BTKD, segment_ids_BT,
      block_rows=r, out_specs=_rows_spec(r, d),
      out_shape=jax.ShapeDtypeStruct((b, g, l, d), q_BSD.dtype),
      num_warps=bs.num_warps_bwd, num_stages=bs.num_stages_bwd, interpret=interpret,
      name="moba_dq")


def keys_before_tile(segment_ids_BT, *, block_size: int, tile: int) -> jax.Array:
  """int32 [B, T // tile]: the non-padding keys of each key tile's block before the tile, i.e.
  the block's own query tokens before it. A block's run starts with those tokens' rows in
  position order and they are causally masked against the tile: dk/dv skip their chunks."""
  b, t = segment_ids_BT.shape
  nonpad_BNP = (segment_ids_BT != 0).astype(jnp.int32).reshape(
      b, t // block_size, block_size // tile, tile).sum(-1)
  return (jnp.cumsum(nonpad_BNP, axis=-1) - nonpad_BNP).reshape(b, t // tile).astype(jnp.int32)


def moba_dkv(q_BSD, do_BSD, lse_BS, delta_BS, layout, k_BTKD, v_BTKD, segment_ids_BT, *,
             block_size, bs: MobaBlockSizes, interpret: bool):
  """dk, dv [B, T, Hkv, D] in k's dtype; every key tile written (zeros if unread)."""
  b, s, d = q_BSD.shape
  _, g, l = layout.row_src_BGL.shape
  t = k_BTKD.shape[1]
  bs = bs.fit(block_size, d)  # as moba_attention does (idempotent)
  tk = bs.block_k_dkv
  tiles_per_block = block_size // tk
  rows_full = pl.BlockSpec((None, None, l), lambda b_, g_, n: (b_, g_, 0))
  kv_tile = pl.BlockSpec((None, tk, None, d), lambda b_, g_, n: (b_, n, g_, 0))
  gh = s // t // g
  kernel = functools.partial(_dkv_kernel, sm_scale=1.0 / math.sqrt(d), block_k=tk,
                             block_rows=bs.block_rows, group_size=gh,
                             skip_full_masks=bs.skip_full_masks,
                             fast_exp2=bs.fast_exp2 and not interpret)
  skip_BN = keys_before_tile(segment_ids_BT, block_size=block_size, tile=tk)
  return pl.pallas_call(
      kernel,
      grid=(b, g, t // tk),
      in_specs=[pl.BlockSpec((None, None, None, 2),
                             lambda b_, g_, n: (b_, g_, n // tiles_per_block, 0)),
                pl.BlockSpec((None, 1), lambda b_, g_, n: (b_, n)),
                pl.BlockSpec((None, None, l // bs.block_rows), lambda b_, g_, n: (b_, g_, 0)),
                rows_full, rows_full, rows_full, _full_spec((s, d)), _full_spec((s, d)),
                _full_spec((s,)), _full_spec((s,)), kv_tile, kv_tile,
                pl.BlockSpec((None, tk), lambda b_, g_, n: (b_, n))],
      out_specs=[kv_tile, kv_tile],
      out_shape=[jax.ShapeDtypeStruct(k_BTKD.shape, k_BTKD.dtype),
                 jax.ShapeDtypeStruct(v_BTKD.shape, v_BTKD.dtype)],
      compiler_params=plgpu.CompilerParams(num_warps=bs.num_warps_bwd,
                                           num_stages=bs.num_stages_bwd),
      interpret=interpret,
      name="moba_dkv",
  )(layout.block_chunks_BGN2, skip_BN, layout.chunk_full_BGC, layout.row_src_BGL,
    layout.row_seg_BGL, layout.row_pos_BGL, q_BSD, do_BSD, lse_BS, delta_BS, k_BTKD, v_BTKD,
    segment_ids_BT.astype(jnp.int32))
