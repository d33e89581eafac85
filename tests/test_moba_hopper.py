"""The Mosaic GPU (Hopper) kernels - forward, dq, dk/dv: GPU interpret mode on CPU against
the Triton kernels (forward and dq row by row, masked and full work items; dk/dv whole), the
interpreter's race detector on, and against the dense reference end to end; their argument
checks; their shared memory and their bulk copies for an H200, lowered ahead of time; a
GPU-marked check of the compiled kernels on an H200."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.moba import MobaBlockSizes, build_kv_layout, hopper, kernels, moba_gate
from tests.test_moba_gate import packed_segments, ragged_budgets
from tests.test_moba_kernel import assert_close, make_inputs, rel_err, run_both

HOPPER = MobaBlockSizes(block_rows=64, block_k=64, block_k_dkv=64)


def kernel_args(hq, hkv, block_size, d=64, key_scale=None):
  """q, dO, lse, delta flattened to [B, T * Hq, ...], the layout padded for the Hopper
  kernels, k, v and segment ids (the backward kernels' arguments; the forward takes q and
  the last four), on fresh bf16 inputs with packed documents and ragged budgets. Any finite
  lse and delta define the same function in the Triton and Hopper kernels; these are of the
  size the real ones take. key_scale: each block's second half of keys times this."""
  rng = np.random.default_rng()
  b, t, k_max = 2, 4 * block_size, 3
  q, k, v, do = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
  if key_scale is not None:
    late = (np.arange(t) % block_size >= block_size // 2)[None, :, None, None]
    k = jnp.where(late, k * key_scale, k).astype(k.dtype)
  # One row of documents starting on blocks, one of documents packed anywhere (blocks that
  # mix documents: the masks' segment test), in every case.
  seg = jnp.concatenate([packed_segments(rng, 1, t, block_size, aligned=aligned)
                         for aligned in (True, False)])
  budget = ragged_budgets(rng, b, 1, k_max)
  sel = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=hq // hkv,
                           block_rows=HOPPER.block_rows, pad_rows=hopper.ITEM_ROWS)
  flat = lambda x: x.reshape(b, t * hq, *x.shape[3:])
  lse = jnp.asarray(rng.uniform(2.0, 6.0, size=(b, t, hq)), jnp.float32)
  delta = jnp.asarray(rng.standard_normal((b, t, hq)), jnp.float32)
  return flat(q), flat(do), flat(lse), flat(delta), layout, k, v, seg


def split_items(layout, seg, block_size, block_kv):
  """How many used work items have halves of unequal key steps (persistent_items): the
  shorter half stops early where its warpgroup has no ping-pong partner to keep turns with."""
  ids, num, _, steps, _ = hopper.persistent_items(layout, seg, block_size=block_size,
                                                  block_kv=block_kv)
  steps = np.asarray(steps)[np.asarray(ids)[:int(num[0])]]
  return int((steps[:, 0] != steps[:, 1]).sum())


def used_item_rows(layout):
  """[B, G, L] bool: the rows of the used work items (those whose first chunk reads a block),
  and of those the real ones (not padding)."""
  chunk_used = np.asarray(layout.chunk_block_BGC) >= 0
  item_used = chunk_used.reshape(*chunk_used.shape[:2], -1, hopper.ITEM_ROWS // HOPPER.block_rows)
  item_rows_BGL = np.repeat(item_used[..., 0], hopper.ITEM_ROWS, axis=-1)
  return item_rows_BGL, item_rows_BGL & (np.asarray(layout.row_seg_BGL) != 0)


def boxed_halves(layout, seg, hq, block_size):
  """How many halves of the used work items box_halves marks."""
  ids, num, *_ = hopper.persistent_items(layout, seg, block_size=block_size,
                                         block_kv=min(128, block_size))
  box = np.asarray(hopper.box_halves(layout, hq))[np.asarray(ids)[:int(num[0])]]
  return int((box & 1).sum() + (box >> 1).sum())


@pytest.mark.parametrize("hq, hkv, block_size", [(2, 2, 128), (4, 4, 64), (4, 2, 256)])
def test_box_halves_are_the_consecutive_token_halves(hq, hkv, block_size):
  """box_halves marks exactly the halves (64 sorted rows) whose rows are 64 consecutive tokens
  of one query head - checked row by row on fresh layouts; some exist with one query head
  per KV group (a block's own tokens), none with two."""
  _, _, _, _, layout, _, _, seg = kernel_args(hq, hkv, block_size)
  src = np.asarray(layout.row_src_BGL)
  b, g, l = src.shape
  got = np.asarray(hopper.box_halves(layout, hq)).reshape(b, g, l // hopper.ITEM_ROWS)
  for bi, gi, item in np.ndindex(got.shape):
    for w in range(2):
      rows = src[bi, gi, item * hopper.ITEM_ROWS + 64 * w:][:64]
      tokens, heads = rows // hq, rows % hq
      want = bool(np.all(heads == heads[0]) and np.all(tokens == tokens[0] + np.arange(64)))
      assert bool(got[bi, gi, item] >> w & 1) == want, (bi, gi, item, w)
  assert (boxed_halves(layout, seg, hq, block_size) > 0) == (hq == hkv)


def dkv_rounding_bounds(args, block_size):
  """Per-element bounds on |dk - dk'| and |dv - dv'| between two kernels that compute the
  same function from the same bf16 inputs, in float64 from the attended pairs the layout
  defines (a row attends the keys of its chunk's block in its document, at or before it).
  Both kernels form the same float32 products but sum them in other orders: a score, hence
  a probability p, differs by at most 2 D 2^-24 sum_d |q_d k_d| (relative, scaled), and dP
  by 2 D 2^-24 sum_d |dO_d v_d|; p and dS = p (dP - delta) are then rounded to bf16, where a
  value may land on the neighbouring bf16 number: one ulp, at most 2^-7 of it. dk and dv sum
  those over the rows (in float32, in other orders again: 2 n 2^-24 of the sum of
  magnitudes) and round once to bf16 (one ulp between the two sides, added by the caller, with
  a factor 1 + 2^-5 for these magnitudes' float64 against the kernels' float32)."""
  q_BSD, do_BSD, lse_BS, delta_BS, layout, k, v, seg = args
  b, t, hkv, d = k.shape
  hq = q_BSD.shape[1] // t
  gh, n, r = hq // hkv, t // block_size, HOPPER.block_rows
  rseg, rsrc = np.asarray(layout.row_seg_BGL), np.asarray(layout.row_src_BGL)
  blk_BGL = np.repeat(np.asarray(layout.chunk_block_BGC), r, axis=-1)
  bi, gi, li = np.nonzero((rseg != 0) & (blk_BGL >= 0))
  reads_BHTN = np.zeros((b, hq, t, n), bool)
  src = rsrc[bi, gi, li]
  reads_BHTN[bi, src % hq, src // hq, blk_BGL[bi, gi, li]] = True
  segs, u = np.asarray(seg), np.arange(t)
  allowed = (reads_BHTN[..., u // block_size] & (u[:, None] >= u[None, :])
             & (segs[:, None, :, None] == segs[:, None, None, :]))
  f64 = lambda x, *shape: np.asarray(x, np.float64).reshape(*shape)
  q, do = f64(q_BSD, b, t, hq, d), f64(do_BSD, b, t, hq, d)
  lse, delta = f64(lse_BS, b, t, hq).transpose(0, 2, 1), f64(delta_BS, b, t, hq).transpose(0, 2, 1)
  kh, vh = (np.repeat(f64(x, b, t, hkv, d), gh, axis=2) for x in (k, v))
  dot = lambda x, y: np.einsum("bthd,buhd->bhtu", x, y)
  scale, ulp, sums = d ** -0.5, 2.0 ** -7, 2 * d * 2.0 ** -24
  p = np.where(allowed, np.exp(scale * dot(q, kh) - lse[..., None]), 0.0)
  ds = p * (dot(do, vh) - delta[..., None])
  rel_p = scale * sums * dot(np.abs(q), np.abs(kh))
  moved_ds = (ulp + rel_p) * np.abs(ds) + p * sums * dot(np.abs(do), np.abs(vh))
  moved_p = (ulp + rel_p) * p
  orders = 2 * t * gh * 2.0 ** -24
  to_keys = lambda w, x: np.einsum("bhtu,bthd->buhd", w, np.abs(x)).reshape(
      b, t, hkv, gh, d).sum(3)
  dk_bound = scale * (to_keys(moved_ds, q) + orders * to_keys(np.abs(ds), q))
  dv_bound = to_keys(moved_p, do) + orders * to_keys(p, do)
  return dk_bound, dv_bound


def assert_outputs_close(got_o, want_o, rows, args, *, block_size, bs):
  """The Hopper and Triton forwards' bf16 outputs on `rows` agree within what bf16 rounding
  allows, element by element. Both compute the same float32 scores and exponentials, but by
  other instructions in another order, so a probability's last float32 bits may differ and
  round to the neighbouring bf16 value: one bf16 ulp, at most 2^-7 of it. Were every weight to
  do so, an output would move by at most 2^-7 sum_j w_j |v_j|: the Triton forward's output on
  the same `args` (q, layout, k, v, segment ids) with |v| in place of v. Each side then rounds
  its output to bf16 once (one ulp between them, at most 2^-7 |o|). The factor 1 + 2^-5 covers
  that magnitude's own bf16 rounding and the bf16 weights' sum against the float32
  normaliser."""
  q, layout, k, v, seg = args
  mag_o, _ = kernels.moba_forward_rows(q, layout, k, jnp.abs(v), seg, block_size=block_size,
                                       bs=bs, interpret=True)
  got, want, mag = (np.asarray(x, np.float32)[rows] for x in (got_o, want_o, mag_o))
  assert np.isfinite(got).all() and np.isfinite(want).all()  # NaN would pass `over` below
  bound = 2 ** -7 * (np.abs(want) + mag) * (1 + 2 ** -5)
  over = np.abs(got - want) > bound
  assert not over.any(), (f"{over.sum()} of {over.size} outputs differ by more than bf16 "
                          f"rounding allows; worst {np.max(np.abs(got - want) - bound):.3g} over")


def assert_forward_close(got, want, rows, args, *, block_size, bs):
  """The Hopper forward's (outputs, lse) against the Triton forward's on `rows`: lse to
  float32's 1e-5, outputs as assert_outputs_close allows."""
  (got_o, got_lse), (want_o, want_lse) = got, want
  np.testing.assert_allclose(np.asarray(got_lse)[rows], np.asarray(want_lse)[rows],
                             rtol=1e-5, atol=1e-5, equal_nan=False)
  assert_outputs_close(got_o, want_o, rows, args, block_size=block_size, bs=bs)


@pytest.mark.parametrize("hq, hkv, block_size, overlap, pingpong, block_kv", [
    (3, 1, 128, True, False, 64), (4, 4, 64, False, True, 64), (2, 2, 256, False, False, 64),
    (2, 1, 256, False, False, 128)])
def test_rows_match_triton_forward(hq, hkv, block_size, overlap, pingpong, block_kv):
  """Partial outputs and lse of every row a used chunk holds: the same function as the
  Triton kernel's with the same key tiles (so the same bf16 roundings of P), on fresh inputs
  with packed documents and ragged budgets. Three persistent CTAs, each running several work
  items of two chunks through one K/V stream; 128-key tiles where the block holds them.
  The gathered q rows the kernel stores for the backward (sorted_q) are those XLA's gather
  puts in sorted order, on every real row of every used item (padding rows: finite). Both
  schedules of the tensor-core turns (overlap), with and without ping-pong between the
  compute warpgroups (pingpong); 64- and 128-key tiles. Without ping-pong an item's half
  whose queries end a key tile before the other's stops there (64-key tiles: in some items
  of every run). The interpreter's race detector watches. With
  one query head per KV group some halves come as one box (box_halves), the rest row by row;
  with three a token's rows come as one box and the rows of the tokens a half cuts one by one
  (_half_plans: 64 is no multiple of 3, so halves start and end inside tokens)."""
  q_BSD, _, _, _, layout, k, v, seg = kernel_args(hq, hkv, block_size)
  args = (q_BSD, layout, k, v, seg)
  assert (boxed_halves(layout, seg, hq, block_size) > 0) == (hq == hkv)
  if block_kv == 64 and block_size > 64:
    assert split_items(layout, seg, block_size, block_kv) > 0
  tiles = dataclasses.replace(HOPPER, block_k=block_kv)
  want_o, want_lse = kernels.moba_forward_rows(*args, block_size=block_size, bs=tiles,
                                               interpret=True)
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax.experimental.pallas import mosaic_gpu as plgpu
  got_o, got_lse, got_q = hopper.moba_forward_rows(
      *args, block_size=block_size, bs=HOPPER, block_kv=tiles.block_k, num_ctas=3,
      sorted_q=True, overlap=overlap, pingpong=pingpong,
      interpret=plgpu.InterpretGPUParams(detect_races=True))
  jax.block_until_ready(got_o)
  assert not gpu_callbacks.get_races().races_found
  assert got_o.dtype == jnp.bfloat16 and got_lse.dtype == jnp.float32
  item_rows_BGL, real_BGL = used_item_rows(layout)
  assert real_BGL.sum() > 0 and (item_rows_BGL & ~real_BGL).sum() > 0
  np.testing.assert_array_equal(np.asarray(got_q)[real_BGL],
                                np.asarray(hopper.sorted_rows(q_BSD, layout))[real_BGL])
  # A used item's padding rows hold rows of q too (which ones, _half_plans says).
  assert np.isfinite(np.asarray(got_q, np.float32)[item_rows_BGL]).all()
  assert_forward_close((got_o, got_lse), (want_o, want_lse), real_BGL, args,
                       block_size=block_size, bs=tiles)


def test_forward_rescales_where_row_maxima_rise():
  """Each block's second half of keys scaled up 8x raises the rows' score maxima in an item's
  later key steps (from ~4 to ~30 in log2 units), so the forward's running maxima move mid-item
  and its output is rescaled there, not only on an item's first step; outputs and lse as the
  Triton forward's on the same inputs."""
  block_size, block_kv = 256, 64
  q_BSD, _, _, _, layout, k, v, seg = kernel_args(2, 2, block_size, key_scale=8.0)
  args = (q_BSD, layout, k, v, seg)
  tiles = dataclasses.replace(HOPPER, block_k=block_kv)
  want_o, want_lse = kernels.moba_forward_rows(*args, block_size=block_size, bs=tiles,
                                               interpret=True)
  got_o, got_lse = hopper.moba_forward_rows(*args, block_size=block_size, bs=HOPPER,
                                            block_kv=block_kv, num_ctas=3, interpret=True)
  _, real_BGL = used_item_rows(layout)
  assert_forward_close((got_o, got_lse), (want_o, want_lse), real_BGL, args,
                       block_size=block_size, bs=tiles)


def test_half_ending_on_a_key_tiles_first_key_takes_that_tile():
  """A block whose first token is padding: its own run's first half (64 rows, one query head
  per KV group) ends on token 64, the first key of the block's second 64-key tile, which that
  row attends (its diagonal) and no other row of the half does. With half_steps the half runs
  its own key steps (persistent_items), which must include that tile; outputs and lse as the
  Triton forward's."""
  rng = np.random.default_rng()
  b, t, hq, hkv, d, block_size, block_kv = 1, 256, 2, 2, 64, 128, 64
  q, k, v, _ = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((b, t), jnp.int32).at[0, 0].set(0)
  sel = moba_gate(q, k, seg, jnp.asarray([2], jnp.int32), block_size=block_size, k_max=2)
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=hq // hkv,
                           block_rows=64, pad_rows=hopper.ITEM_ROWS)
  assert int(np.asarray(layout.row_pos_BGL)[0, 0, 63]) == block_kv  # the half's last row
  args = (q.reshape(b, t * hq, d), layout, k, v, seg)
  tiles = dataclasses.replace(HOPPER, block_k=block_kv)
  want_o, want_lse = kernels.moba_forward_rows(*args, block_size=block_size, bs=tiles,
                                               interpret=True)
  got_o, got_lse = hopper.moba_forward_rows(*args, block_size=block_size, bs=HOPPER,
                                            block_kv=block_kv, num_ctas=2, pingpong=False,
                                            half_steps=True, interpret=True)
  _, real_BGL = used_item_rows(layout)
  assert_forward_close((got_o, got_lse), (want_o, want_lse), real_BGL, args,
                       block_size=block_size, bs=tiles)


def test_gathered_halves_that_start_inside_a_token_across_gaps():
  """Three query heads per KV group, and a selection (built here, not by the gate) in which
  every other token of block 1 reads block 0: block 0's run then holds tokens with gaps
  between them, and its later halves start inside a token (at head 1 or 2: 64 rows are no
  multiple of 3), so the gatherer's plan for such a half (_half_plans, chosen by its first
  row's head) must start its boxes at the next whole token; a box at the wrong offset would
  span two tokens that are not consecutive in q. The forward's gathered q rows (sorted_q)
  are XLA's gather of the same rows, and its outputs and lse the Triton forward's."""
  rng = np.random.default_rng()
  b, t, hq, hkv, d, block_size = 1, 256, 3, 1, 64, 128
  q, k, v, _ = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((b, t), jnp.int32)
  tok = np.arange(t)
  picks = np.where((tok >= block_size) & (tok % 2 == 0), 0, 2)
  selected = np.stack([tok // block_size, picks], -1)[None, :, None, :].astype(np.int32)
  sel = moba_gate(q, k, seg, jnp.asarray([2], jnp.int32), block_size=block_size, k_max=2)
  sel = dataclasses.replace(sel, selected_BTGK=jnp.asarray(selected),
                            count_BTG=jnp.asarray(1 + (picks == 0), jnp.int32)[None, :, None])
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=hq // hkv,
                           block_rows=64, pad_rows=hopper.ITEM_ROWS)
  src = np.asarray(layout.row_src_BGL)[0, 0]
  gapped = range(hq * block_size + 64, hq * (block_size + block_size // 2), 64)  # block 0's run
  first_heads = {int(src[r] % hq) for r in gapped}
  assert first_heads == {1, 2}  # halves of block 0's gapped rows start inside tokens
  args = (q.reshape(b, t * hq, d), layout, k, v, seg)
  want_o, want_lse = kernels.moba_forward_rows(*args, block_size=block_size, bs=HOPPER,
                                               interpret=True)
  got_o, got_lse, got_q = hopper.moba_forward_rows(*args, block_size=block_size, bs=HOPPER,
                                                   block_kv=64, num_ctas=2, sorted_q=True,
                                                   interpret=True)
  _, real_BGL = used_item_rows(layout)
  np.testing.assert_array_equal(np.asarray(got_q)[real_BGL],
                                np.asarray(hopper.sorted_rows(args[0], layout))[real_BGL])
  assert_forward_close((got_o, got_lse), (want_o, want_lse), real_BGL, args,
                       block_size=block_size, bs=HOPPER)


def test_gather_rows_match_xla_gather():
  """The Triton row gather (hopper.gather_rows, what the backward kernels read q and dO
  through) equals XLA's gather of the same rows on every row of every used work item,
  padding rows included; a run length that is not a whole number of chunks is an error."""
  do_BSD, layout = (lambda a: (a[1], a[4]))(kernel_args(4, 2, 128, d=128))
  got = np.asarray(hopper.gather_rows(do_BSD, layout, interpret=True))
  rows, _ = used_item_rows(layout)
  assert rows.sum() > 0 and (~rows).sum() > 0
  np.testing.assert_array_equal(got[rows], np.asarray(hopper.sorted_rows(do_BSD, layout))[rows])
  with pytest.raises(ValueError, match="run_rows"):
    kernels.gather_rows(do_BSD, layout, run_rows=96, interpret=True)


@pytest.mark.parametrize(
    "hq, hkv, block_size, presorted, sorted_do, overlap, pingpong, block_kv, num_ctas", [
        (3, 1, 128, False, False, True, True, 64, 3),
        (2, 2, 256, True, False, False, False, None, 3),
        (2, 1, 256, True, True, True, True, None, 3),
        (2, 2, 128, False, True, False, True, None, 3),
        (2, 2, 256, True, True, False, False, 64, 3),
        (1, 1, 128, True, True, True, False, 64, 40)])
def test_dq_rows_match_triton_dq(hq, hkv, block_size, presorted, sorted_do, overlap, pingpong,
                                 block_kv, num_ctas):
  """Partial dq of every row a used chunk holds equals the Triton dq kernel's (64-key tiles;
  the Hopper kernel's 64 or 128), given the same final lse and delta, on fresh inputs with
  packed documents and ragged budgets, with q and dO rows gathered by the kernel, by the
  row-gather kernel beforehand, or q's beforehand and dO's by the kernel, which then also
  returns them in sorted order (sorted_do); both schedules of the tensor-core turns
  (overlap), with and without ping-pong (pingpong); 64-key K/V tiles and the default at this
  head_dim (128); without ping-pong (half_steps) an item's half whose queries end a key tile
  before the other's stops there (64-key tiles: in some items of every run); the
  interpreter's race detector watches the run. Gathered with one query
  head per KV group, some halves come as one box (box_halves); with more, each whole token's
  rows come as one box (_half_plans; three heads: halves cut tokens). Presorted q comes into
  tiles of two item parities, freed per item: the last case has more CTAs than items, so some
  run none."""
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax.experimental.pallas import mosaic_gpu as plgpu
  args = kernel_args(hq, hkv, block_size)
  layout = args[4]
  if not presorted or sorted_do:
    assert (boxed_halves(layout, args[7], hq, block_size) > 0) == (hq == hkv)
  if block_kv == 64 and not pingpong:
    assert split_items(layout, args[7], block_size, block_kv) > 0
  want = kernels.moba_dq_rows(*args, block_size=block_size, bs=HOPPER, interpret=True)
  got = hopper.moba_dq_rows(*args, block_size=block_size, bs=HOPPER, num_ctas=num_ctas,
                            presorted=presorted, sorted_do=sorted_do, overlap=overlap,
                            pingpong=pingpong, block_kv=block_kv, half_steps=not pingpong,
                            interpret=plgpu.InterpretGPUParams(detect_races=True))
  jax.block_until_ready(got)
  assert not gpu_callbacks.get_races().races_found
  if num_ctas > 3:
    items = hopper.persistent_items(layout, args[7], block_size=block_size, block_kv=64)[1]
    assert 0 < int(items[0]) < num_ctas
  real_BGL = np.repeat(np.asarray(layout.chunk_block_BGC) >= 0, HOPPER.block_rows, axis=-1) & (
      np.asarray(layout.row_seg_BGL) != 0)
  if sorted_do:
    got, do_rows = got
    np.testing.assert_array_equal(np.asarray(do_rows)[real_BGL],
                                  np.asarray(hopper.sorted_rows(args[1], layout))[real_BGL])
  assert got.dtype == jnp.bfloat16 and got.shape == want.shape
  got, want = (np.asarray(x, np.float32)[real_BGL] for x in (got, want))
  # Same float32 sums of bf16 products; each side rounds dS to bf16 once per key (one ulp,
  # 2^-8 relative, where the two exponentials differ in their last bits) and dq once.
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2e-3 * scale)
  assert rel_err(got, want) < 2 ** -8


@pytest.mark.parametrize("hq, hkv, block_size, d, pingpong, chunk_rows", [
    (2, 1, 128, 64, False, 64), (4, 2, 256, 64, True, 64), (2, 2, 128, 128, False, 64),
    (2, 1, 128, 64, True, 128), (4, 2, 256, 64, False, 128)])
def test_dkv_match_triton_dkv(hq, hkv, block_size, d, pingpong, chunk_rows):
  """dk and dv equal the Triton dk/dv kernel's, given the same lse and delta, on fresh inputs
  with packed documents and ragged budgets, at head_dim 64 and 128; more key tiles than
  persistent CTAs, several chunks per tile; with and without ping-pong between the compute
  warpgroups (pingpong); 64- and 128-row chunk steps (block 256: own-block rows before the
  second key tile skipped in whole steps); the interpreter's race detector watches the run."""
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax.experimental.pallas import mosaic_gpu as plgpu
  args = kernel_args(hq, hkv, block_size, d)
  want = kernels.moba_dkv(*args, block_size=block_size, bs=HOPPER, interpret=True)
  got = hopper.moba_dkv(*args, block_size=block_size, bs=HOPPER, num_ctas=3, pingpong=pingpong,
                        chunk_rows=chunk_rows,
                        interpret=plgpu.InterpretGPUParams(detect_races=True))
  jax.block_until_ready(got)
  assert not gpu_callbacks.get_races().races_found
  for name, g, w, moved in zip(("dk", "dv"), got, want, dkv_rounding_bounds(args, block_size)):
    assert g.dtype == jnp.bfloat16 and g.shape == w.shape
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    over = np.abs(g - w) > (moved + 2 ** -7 * np.abs(w)) * (1 + 2 ** -5)
    assert not over.any(), (name, f"{over.sum()} of {over.size} beyond bf16 rounding")
    assert rel_err(g, w) < 2 ** -8, name


def test_dkv_items_cover_each_run_once():
  """Split tiles' parts tile their runs exactly, in order, no part longer than the share m or
  shorter than the minimum unless last; whole tiles are one item each; slots are unique and
  every used one names its tile and the tile's first slot; every item in use comes before the
  unused ones."""
  rng = np.random.default_rng()
  grid = int(rng.integers(2, 9))
  n = int(rng.integers(grid, 8 * grid))
  first = rng.integers(0, 50, n)
  length = np.where(rng.random(n) < 0.2, rng.integers(50, 400, n), rng.integers(0, 12, n))
  items = hopper.dkv_items(jnp.asarray(first, jnp.int32), jnp.asarray(first + length, jnp.int32),
                           grid)
  num = int(items.num_1[0])
  tile, lo, hi, part = (np.asarray(a)[:num] for a in (items.tile_I, items.first_I, items.end_I,
                                                      items.part_I))
  share = max(-(-int(length.sum()) // (hopper.dkv._DKV_SPLITS_PER_CTA * grid)),
              hopper.dkv._DKV_MIN_SPLIT_CHUNKS)
  lens = hi - lo
  assert list(lens) == sorted(lens, reverse=True)  # longest first
  part_tile, part_lead = np.asarray(items.part_tile_P), np.asarray(items.part_lead_P)
  for f in range(n):
    mine = np.flatnonzero(tile == f)
    spans = sorted(zip(lo[mine], hi[mine]))
    assert spans[0][0] == first[f] and spans[-1][1] == first[f] + length[f]
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if length[f] <= share:
      assert len(mine) == 1 and part[mine[0]] == -1
    else:
      assert all(b - a <= share for a, b in spans) and (part[mine] >= 0).all()
      slots = np.sort(part[mine])
      assert (part_tile[slots] == f).all() and (part_lead[slots] == slots[0]).all()
  used = part[part >= 0]
  assert len(set(used)) == len(used) and len(used) <= part_tile.shape[0]
  assert (part_tile >= 0).sum() == len(used)


def test_split_parts_sum_to_their_tile_in_float32():
  """_add_parts: each split tile's rows become the float32 sum of its parts, each part taken as
  its bf16 hi + lo pair (bf16 rounds to 2^-8: the pair holds the part to 2^-16, hi alone to
  2^-8); tiles not split keep x's rows (exactly). Two KV groups of four 128-key tiles, parts of
  random float32 values."""
  rng = np.random.default_rng()
  b, g, d, tiles = 1, 2, 16, 4
  t = tiles * hopper.DKV_TILE
  first = rng.integers(0, 10, g * tiles)
  length = np.where(np.arange(g * tiles) % 3 == 0, rng.integers(60, 200, g * tiles),
                    rng.integers(0, 8, g * tiles))
  items = hopper.dkv_items(jnp.asarray(first, jnp.int32), jnp.asarray(first + length, jnp.int32),
                           8)  # a share of about a 1/8 of the chunks: the long runs split
  part_tile = np.asarray(items.part_tile_P)
  assert len(set(part_tile[part_tile >= 0])) >= 2  # split tiles, several parts each
  parts = rng.standard_normal((part_tile.shape[0], hopper.DKV_TILE, d)).astype(np.float32)
  hi = jnp.asarray(parts, jnp.bfloat16)
  lo = jnp.asarray(parts - np.asarray(hi, np.float32), jnp.bfloat16)
  x = rng.standard_normal((b, t, g, d)).astype(np.float32)
  got = np.asarray(hopper.dkv._add_parts(jnp.asarray(x), hi, lo, items, num_groups=g))
  want = x.reshape(b, tiles, hopper.DKV_TILE, g, d).copy()
  bound = np.zeros_like(want)  # a pair's error is at most 2^-16 of its part, float32's below
  for f in set(part_tile[part_tile >= 0]):
    at = (f // (g * tiles), f % tiles, slice(None), (f // tiles) % g)
    want[at] = parts[part_tile == f].sum(0)
    bound[at] = 2.0**-16 * np.abs(parts[part_tile == f]).sum(0) + 1e-6
  err = np.abs(got - want.reshape(b, t, g, d))
  assert (err <= bound.reshape(b, t, g, d)).all(), err.max()


def test_dkv_items_without_splits_are_the_tiles_longest_first():
  first = jnp.asarray([0, 5, 9, 2], jnp.int32)
  end = jnp.asarray([40, 6, 9, 30], jnp.int32)
  items = hopper.dkv_items(first, end, 2, split=False)
  assert int(items.num_1[0]) == 4
  np.testing.assert_array_equal(items.tile_I, [0, 3, 1, 2])
  np.testing.assert_array_equal(items.end_I - items.first_I, [40, 28, 1, 0])
  assert (np.asarray(items.part_I) == -1).all()


@pytest.mark.parametrize("chunk_rows", [64, 128])
def test_dkv_with_split_runs_matches_triton_dkv(chunk_rows, monkeypatch):
  """A gate that sends every token to the first blocks (a key direction shared by every
  query) makes their runs long: their tiles are split into parts summed after the kernel,
  and dk, dv still match the Triton kernel's within bf16 rounding (64- and 128-row chunk
  steps)."""
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax.experimental.pallas import mosaic_gpu as plgpu
  monkeypatch.setattr(hopper.dkv, "_DKV_MIN_SPLIT_CHUNKS", 2 * chunk_rows // 64)
  rng = np.random.default_rng()
  hq, hkv, block_size, d = 2, 1, 128, 64  # head_dim 64: split_dkv_runs' default is on
  b, t, k_max = 1, 8 * block_size, 3
  q, k, v, do = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
  bias = jnp.asarray(rng.standard_normal(d) * 2.0, jnp.bfloat16)
  q = q + bias
  k = k.at[:, :2 * block_size].add(bias)
  seg = jnp.ones((b, t), jnp.int32)
  sel = moba_gate(q, k, seg, jnp.asarray([k_max]), block_size=block_size, k_max=k_max)
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=hq // hkv,
                           block_rows=HOPPER.block_rows, pad_rows=hopper.ITEM_ROWS)
  flat = lambda x: x.reshape(b, t * hq, *x.shape[3:])
  lse = jnp.asarray(rng.uniform(2.0, 6.0, size=(b, t, hq)), jnp.float32)
  delta = jnp.asarray(rng.standard_normal((b, t, hq)), jnp.float32)
  args = (flat(q), flat(do), flat(lse), flat(delta), layout, k, v, seg)
  chunks = np.asarray(layout.block_chunks_BGN2)[0, 0]
  assert (chunks[:2, 1] - chunks[:2, 0]).min() > 2 * (chunks[2:, 1] - chunks[2:, 0]).max()
  made = []
  dkv_items = hopper.dkv_items
  monkeypatch.setattr(hopper.dkv, "dkv_items",
                      lambda *a, **kw: made.append(dkv_items(*a, **kw)) or made[-1])
  want = kernels.moba_dkv(*args, block_size=block_size, bs=HOPPER, interpret=True)
  got = hopper.moba_dkv(*args, block_size=block_size, bs=HOPPER, num_ctas=3,
                        chunk_rows=chunk_rows,
                        interpret=plgpu.InterpretGPUParams(detect_races=True))
  jax.block_until_ready(got)
  assert not gpu_callbacks.get_races().races_found
  [items] = made
  assert (np.asarray(items.part_I)[:int(items.num_1[0])] >= 0).sum() >= 2  # splits ran
  for name, g, w, moved in zip(("dk", "dv"), got, want, dkv_rounding_bounds(args, block_size)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    over = np.abs(g - w) > (moved + 2 ** -7 * np.abs(w)) * (1 + 2 ** -5)
    assert not over.any(), (name, f"{over.sum()} of {over.size} beyond bf16 rounding")
    assert rel_err(g, w) < 2 ** -8, name


def test_persistent_full_items_match_triton_forward():
  """One long document and every block chosen: most work items are full (run without the
  mask); their rows still equal the Triton kernel's, and the run has no data race."""
  rng = np.random.default_rng()
  b, t, hq, hkv, d, block_size, k_max = 1, 512, 2, 1, 64, 64, 4
  q, k, v, _ = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((b, t), jnp.int32)
  budget = jnp.asarray([k_max], jnp.int32)
  sel = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=hq // hkv,
                           block_rows=64, pad_rows=hopper.ITEM_ROWS)
  ids, num, _, _, full = hopper.persistent_items(layout, seg, block_size=block_size,
                                                 block_kv=64)
  used_full = np.asarray(full)[np.asarray(ids)[:int(num[0])]]
  assert 0 < used_full.sum() < used_full.size  # full and masked items both run
  args = (q.reshape(b, t * hq, d), layout, k, v, seg)
  want_o, want_lse = kernels.moba_forward_rows(*args, block_size=block_size, bs=HOPPER,
                                               interpret=True)
  # The interpreter's happens-before race detector watches every shared-memory access of
  # the three warpgroups and the copy engine (JAX internals: its state is not public API).
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax.experimental.pallas import mosaic_gpu as plgpu
  got_o, got_lse = hopper.moba_forward_rows(
      *args, block_size=block_size, bs=HOPPER, num_ctas=2,
      interpret=plgpu.InterpretGPUParams(detect_races=True))
  jax.block_until_ready(got_o)
  assert not gpu_callbacks.get_races().races_found
  real = np.repeat(np.asarray(layout.chunk_block_BGC) >= 0, 64, axis=-1) & (
      np.asarray(layout.row_seg_BGL) != 0)
  assert_forward_close((got_o, got_lse), (want_o, want_lse), real, args,
                       block_size=block_size, bs=HOPPER)


def test_attention_with_mosaic_kernels_matches_reference():
  """backend='mosaic': the Hopper forward, dq and dk/dv kernels end to end."""
  rng = np.random.default_rng()
  b, t, block_size, k_max = 2, 512, 128, 3
  q, k, v, do = make_inputs(rng, b, t, 4, 2, 64, jnp.bfloat16)
  # Documents anywhere (blocks shared by two documents): the same-document masks are tested.
  seg = packed_segments(rng, b, t, block_size, aligned=False)
  budget = ragged_budgets(rng, b, 1, k_max)
  got, want = run_both(q, k, v, do, seg, budget, block_size, k_max, bs=HOPPER,
                       backend="mosaic")
  assert_close(got, want, jnp.bfloat16)
  pad = np.asarray(seg) == 0
  assert np.all(np.asarray(got[0], np.float32)[pad] == 0)


@pytest.mark.parametrize("num", [1, 7, 300])
def test_longest_first_is_a_stable_descending_argsort(num, monkeypatch):
  """dk/dv's item order, by comparisons and (past the size limit) by a sort."""
  rng = np.random.default_rng()
  length = rng.integers(0, 5, num).astype(np.int32)  # many ties
  want = np.argsort(-length, kind="stable")
  np.testing.assert_array_equal(hopper.longest_first(jnp.asarray(length)), want)
  monkeypatch.setattr(hopper.dkv, "_RANK_BY_COMPARISON_MAX", num - 1)
  np.testing.assert_array_equal(hopper.longest_first(jnp.asarray(length)), want)


@pytest.mark.parametrize("dtype, d, bs, match", [
    (jnp.float32, 64, HOPPER, "bfloat16"),
    (jnp.bfloat16, 32, MobaBlockSizes(block_rows=64, block_k=32, block_k_dkv=32), "head_dim"),
    (jnp.bfloat16, 256, HOPPER, "head_dim"),
    (jnp.bfloat16, 64, MobaBlockSizes(block_rows=32, block_k=64), "block_rows"),
    (jnp.bfloat16, 64, HOPPER, "block_size"),  # block_size=64 < the dk/dv key tile
])
def test_unsupported_arguments_are_errors(dtype, d, bs, match):
  from pallas_kernels.moba import moba_attention
  rng = np.random.default_rng()
  q, k, v, _ = make_inputs(rng, 1, 128, 2, 2, d, dtype)
  seg = jnp.ones((1, 128), jnp.int32)
  with pytest.raises(ValueError, match=match):
    moba_attention(q, k, v, seg, jnp.asarray([2]), block_size=64, k_max=2, block_sizes=bs,
                   backend="mosaic", interpret=True)
  with pytest.raises(ValueError, match="backend"):
    moba_attention(q, k, v, seg, jnp.asarray([2]), block_size=64, k_max=2,
                   backend="cuda", interpret=True)


def test_layout_without_128_row_runs_is_an_error():
  """The Hopper kernels read runs of 128 rows (work items; dk/dv's chunk steps): a layout whose
  runs are padded to 64 only is refused with the fix, before any kernel is built."""
  rng = np.random.default_rng()
  b, t, hq, hkv, d, block_size = 1, 512, 2, 1, 64, 128
  q, k, v, do = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((b, t), jnp.int32)
  sel = moba_gate(q, k, seg, jnp.asarray([3]), block_size=block_size, k_max=3)
  kw = dict(num_blocks=t // block_size, group_size=hq // hkv, block_rows=64)
  assert build_kv_layout(sel, seg, pad_rows=hopper.ITEM_ROWS, **kw).run_rows == hopper.ITEM_ROWS
  short = build_kv_layout(sel, seg, **kw)
  assert short.run_rows == 64
  flat = lambda x: x.reshape(b, t * hq, *x.shape[3:])
  rows = jnp.zeros((b, t * hq), jnp.float32)
  common = dict(block_size=block_size, bs=HOPPER, interpret=True)
  with pytest.raises(ValueError, match="pad_rows=hopper.ITEM_ROWS"):
    hopper.moba_forward_rows(flat(q), short, k, v, seg, **common)
  for fn in (hopper.moba_dq_rows, hopper.moba_dkv):
    with pytest.raises(ValueError, match="pad_rows=hopper.ITEM_ROWS"):
      fn(flat(q), flat(do), rows, rows, short, k, v, seg, **common)


def test_compiled_kernels_off_hopper_are_an_error():
  """Compiled (not interpreted) Mosaic GPU kernels need a Hopper GPU; on any other device the
  call says so instead of failing in the lowering. Interpret mode runs anywhere, on CPU given
  enough host devices (fewer: an error naming the flag, not a call that never returns)."""
  from pallas_kernels.moba import moba_attention
  hopper.check_device(True)
  device = jax.devices()[0]
  if device.platform == "cpu":
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(jax, "device_count", lambda *a: hopper.INTERPRET_MIN_HOST_DEVICES - 1)
      with pytest.raises(ValueError, match="xla_force_host_platform_device_count=4"):
        hopper.check_device(True)
  if device.platform == "gpu" and str(device.compute_capability).startswith("9"):
    hopper.check_device(False)  # the compiled kernels run here (test_gpu_compiled_mosaic_...)
    return
  q, k, v, _ = make_inputs(np.random.default_rng(), 1, 256, 2, 2, 64, jnp.bfloat16)
  with pytest.raises(ValueError, match="Hopper"):
    moba_attention(q, k, v, jnp.ones((1, 256), jnp.int32), jnp.asarray([2]), block_size=128,
                   k_max=2, block_sizes=HOPPER, backend="mosaic", interpret=False)


def test_half_steps_under_pingpong_is_an_error():
  """Under ping-pong both compute warpgroups take every turn of an item."""
  q_BSD, do_BSD, lse, delta, layout, k, v, seg = kernel_args(2, 2, 128)
  with pytest.raises(ValueError, match="half_steps"):
    hopper.moba_forward_rows(q_BSD, layout, k, v, seg, block_size=128, bs=HOPPER,
                             interpret=True, pingpong=True, half_steps=True)
  with pytest.raises(ValueError, match="half_steps"):
    hopper.moba_dq_rows(q_BSD, do_BSD, lse, delta, layout, k, v, seg, block_size=128,
                        bs=HOPPER, interpret=True, pingpong=True, half_steps=True)


@pytest.mark.parametrize("stages", [1, (3, 1), (1, 2)])
def test_fewer_than_two_stages_is_an_error(stages):
  """Each K/V stream needs two slots (one filling while one is read)."""
  q_BSD, _, _, _, layout, k, v, seg = kernel_args(2, 2, 128)
  with pytest.raises(ValueError, match="two stages"):
    hopper.moba_forward_rows(q_BSD, layout, k, v, seg, block_size=128, bs=HOPPER,
                             interpret=True, stages=stages)


@pytest.mark.gpu
def test_gpu_compiled_mosaic_kernels_match_reference():
  if "H100" not in jax.devices()[0].device_kind and "H200" not in jax.devices()[0].device_kind:
    pytest.fail(f"the Mosaic GPU kernels target Hopper, found {jax.devices()[0].device_kind}")
  rng = np.random.default_rng()
  b, t, block_size, k_max = 2, 2048, 256, 4
  for hq, hkv, d in ((14, 2, 64), (4, 4, 128)):  # 7 heads a group: halves cut tokens
    q, k, v, do = make_inputs(rng, b, t, hq, hkv, d, jnp.bfloat16)
    # Documents anywhere (blocks shared by two documents): the same-document masks are tested.
    seg = packed_segments(rng, b, t, block_size, aligned=False)
    budget = jnp.asarray([2, 4], jnp.int32)
    got, want = run_both(q, k, v, do, seg, budget, block_size, k_max,
                         bs=MobaBlockSizes(block_k=128), interpret=False,
                         backend="mosaic")
    assert_close(got, want, jnp.bfloat16, names=[f"{n} at {hq}/{hkv} x {d}"
                                                 for n in ("out", "dq", "dk", "dv")])


def lower_kernel_for_h200(kernel, hq, hkv, d, block_size, t, **params):
  """One Hopper kernel with its gate and layout (k_max 3; shapes only, no values), jitted and
  lowered for an H200 on the CPU; Mosaic GPU sizes shared memory and issues its copies while
  lowering. kernel: "fwd", "dq", "dq_sorted_do", "dkv" or "dkv_128_rows"; params go to the
  kernel (e.g. stages)."""
  from experiments.triton_ir import lower_for_h200
  from pallas_kernels.moba.gating import fused_gate
  shape = lambda h: jax.ShapeDtypeStruct((1, t, h, d), jnp.bfloat16)

  def run(q, k, v, do, seg, budget):
    sel = fused_gate(q, k, seg, budget, block_size=block_size, k_max=3, interpret=False)
    layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=hq // hkv,
                             block_rows=64, mark_full=False, pad_rows=hopper.ITEM_ROWS)
    flat = lambda x: x.reshape(1, t * hq, *x.shape[3:])
    common = dict(block_size=block_size, bs=HOPPER, interpret=False, num_ctas=132, **params)
    if kernel == "fwd":
      return hopper.moba_forward_rows(flat(q), layout, k, v, seg, **common)
    lse = jnp.zeros((1, t, hq), jnp.float32)
    if kernel == "dq_sorted_do":
      common["sorted_do"] = True
    if kernel == "dkv_128_rows":
      common["chunk_rows"] = 128
    fn = hopper.moba_dkv if kernel.startswith("dkv") else hopper.moba_dq_rows
    return fn(flat(q), flat(do), flat(lse), flat(lse), layout, k, v, seg, **common)

  return lower_for_h200(run, shape(hq), shape(hkv), shape(hkv), shape(hq),
                        jax.ShapeDtypeStruct((1, t), jnp.int32),
                        jax.ShapeDtypeStruct((1,), jnp.int32))


@pytest.mark.parametrize("kernel, hq, hkv, d, block_size, stages, fits", [
    ("fwd", 16, 16, 128, 512, 2, True), ("fwd", 14, 2, 64, 256, 2, True),
    ("fwd", 16, 16, 128, 512, 3, False),
    ("dq", 16, 16, 128, 512, 2, True), ("dq", 16, 16, 128, 512, 3, True),
    ("dq", 16, 16, 128, 512, 4, False), ("dq_sorted_do", 16, 16, 128, 512, 2, True),
    ("dq_sorted_do", 16, 16, 128, 512, 3, False), ("dq_sorted_do", 16, 16, 128, 512, (3, 2), True),
    ("dq_sorted_do", 14, 2, 64, 512, (3, 2), True),
    ("dkv", 16, 16, 128, 512, 2, True), ("dkv", 14, 2, 64, 256, 2, True),
    ("dkv", 16, 16, 128, 512, 3, False), ("dkv_128_rows", 16, 16, 128, 512, 2, False)])
def test_kernels_fit_h200_shared_memory(kernel, hq, hkv, d, block_size, stages, fits):
  """Lowered ahead of time for an H200 on the CPU (Mosaic GPU sizes shared memory while
  lowering): each kernel's default configuration fits at the headline shapes (dq at head_dim
  64 with its default 128-key tiles; dk/dv there on 128-row chunk steps); one more pipeline
  stage at head_dim 128 does not (dq with both operands sorted: two more; dq's default is
  three K stages and two V), nor dk/dv's 128-row steps there."""
  lower = lambda: lower_kernel_for_h200(kernel, hq, hkv, d, block_size, 32768, stages=stages)
  if fits:
    assert "mosaic_gpu" in lower().as_text()
  else:
    with pytest.raises(ValueError, match="shared memory"):
      lower()


@pytest.mark.parametrize("kernel, hq, hkv, d", [("fwd", 16, 16, 128), ("dq_sorted_do", 14, 2, 64)])
def test_unswizzled_copies_are_bulk_copies(kernel, hq, hkv, d, monkeypatch):
  """Lowered for an H200 on the CPU, every copy the streams make into unswizzled shared memory
  (row ids, the rows' segments and positions, key segments) promises to stay in bounds, which
  makes it one bulk copy from a pointer (cp.async.bulk) rather than a tensor copy. The swizzled
  ones (K/V tiles, gathered rows, boxes), tensor copies whatever their mode, are only checked to
  be there."""
  from jax.experimental.mosaic.gpu import launch_context
  copies = []
  async_copy = launch_context.LaunchContext.async_copy

  def record(self, **kw):
    if kw.get("barrier") is not None:  # gmem -> smem
      copies.append((str(kw.get("swizzle")), kw.get("oob_mode")))
    return async_copy(self, **kw)

  monkeypatch.setattr(launch_context.LaunchContext, "async_copy", record)
  lower_kernel_for_h200(kernel, hq, hkv, d, 512, 4096)
  plain = [oob for swizzle, oob in copies if swizzle.endswith("kNoSwizzle")]
  swizzled = [oob for swizzle, oob in copies if not swizzle.endswith("kNoSwizzle")]
  assert len(plain) >= 4 and swizzled
  assert all(oob == launch_context.OOBFillMode.PROMISE_IN_BOUNDS for oob in plain)


@pytest.mark.parametrize("hq, hkv, d, backend", [(16, 16, 128, "mosaic"), (14, 2, 64, "mosaic"),
                                                 (14, 2, 64, "triton")])
def test_step_glue_has_no_while_loop(hq, hkv, d, backend, monkeypatch):
  """The forward+backward of moba_attention, lowered for an H200 on the CPU, holds no while
  loop outside the kernels (custom calls): XLA's GPU runtime reads a while loop's condition
  back to the host on every trip, the GPU idle meanwhile. Both Hopper dk/dv item plans (whole
  runs at head_dim 128, split runs at 64) and the Triton kernels' glue."""
  from experiments.triton_ir import lower_for_h200
  from pallas_kernels.moba import moba_attention
  monkeypatch.setattr(hopper, "check_device", lambda interpret: None)  # the CPU lowers for a GPU
  t, block_size = 4096, 512
  shape = lambda h: jax.ShapeDtypeStruct((1, t, h, d), jnp.bfloat16)

  def loss(q, k, v, do, seg, budget):
    out = moba_attention(q, k, v, seg, budget, block_size=block_size, k_max=3, backend=backend)
    return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))

  args = (shape(hq), shape(hkv), shape(hkv), shape(hq), jax.ShapeDtypeStruct((1, t), jnp.int32),
          jax.ShapeDtypeStruct((1,), jnp.int32))
  text = lower_for_h200(jax.grad(loss, argnums=(0, 1, 2)), *args).as_text()
  assert text.count("mosaic_gpu" if backend == "mosaic" else "xla.gpu.triton") >= 3
  assert "stablehlo.while" not in text
