"""MoBA gating: prefix-sum gate vs the dense definition, selection, coverage, validation (the
KV layout built from the selection: test_kv_layout.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.moba import gating, moba_attention, moba_coverage, moba_gate
from pallas_kernels.moba.reference import reference_gate_scores


def packed_segments(rng, b, t, block_size, aligned):
  """Contiguous documents with padding gaps; aligned=True starts each on a block."""
  seg = np.zeros((b, t), np.int32)
  for row in range(b):
    pos, doc = 0, 1
    while pos < t:
      length = int(rng.integers(1, 3 * block_size))
      seg[row, pos:pos + length] = doc
      pos += length
      doc += 1
      if aligned:
        pos = -(-pos // block_size) * block_size
      pos += int(rng.integers(0, 4)) if not aligned else 0
  return jnp.asarray(seg)


def ragged_budgets(rng, b, low, high):
  """b budgets drawn from [low, high], int32, at least two of them different (b > 1)."""
  budget = rng.integers(low, high + 1, size=b)
  if b > 1 and high > low and np.all(budget == budget[0]):
    budget[rng.integers(b)] = low if budget[0] != low else high
  return jnp.asarray(budget, jnp.int32)


def _inputs(rng, b=2, t=128, hq=4, hkv=2, d=16):
  q = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.float32)
  return q, k


@pytest.mark.parametrize("aligned", [True, False])
def test_prefix_gate_matches_dense_definition(aligned):
  rng = np.random.default_rng()
  q, k = _inputs(rng)
  seg = packed_segments(rng, 2, 128, 16, aligned)
  got = gating.gate_scores(q, k, seg, block_size=16)
  want = reference_gate_scores(q, k, seg, block_size=16)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
  fin = np.isfinite(want)
  np.testing.assert_allclose(np.asarray(got)[fin], np.asarray(want)[fin], rtol=1e-4, atol=1e-4)


def test_selection_counts_and_coverage():
  rng = np.random.default_rng()
  q, k = _inputs(rng)
  # Row 0: short documents anywhere in the row; row 1: one document, up to 7 eligible blocks,
  # so that a budget of 5 leaves unchosen mass and coverage is below 1.
  seg = jnp.stack([packed_segments(rng, 1, 128, 16, aligned=False)[0],
                   jnp.ones((128,), jnp.int32)])
  k_max = 5
  budget = jnp.asarray([2, 5], jnp.int32)
  sel = moba_gate(q, k, seg, budget, block_size=16, k_max=k_max)
  scores = np.asarray(reference_gate_scores(q, k, seg, block_size=16), np.float64)
  n_elig = np.isfinite(scores).sum(-1)  # [B, T, G]
  nonpad = np.asarray(seg)[..., None] != 0
  want_count = np.where(nonpad, 1 + np.minimum(n_elig, np.asarray(budget)[:, None, None] - 1), 0)
  np.testing.assert_array_equal(np.asarray(sel.count_BTG), want_count)
  own = np.arange(128) // 16
  selected = np.asarray(sel.selected_BTGK)
  np.testing.assert_array_equal(
      selected[..., 0], np.broadcast_to(np.where(nonpad, own[None, :, None], 8), want_count.shape))
  # Coverage of every token from the dense scores: the softmax mass (over its eligible blocks)
  # of its top budget - 1 blocks; 1 where it chose them all or has none (and on padding).
  mx = np.where(n_elig > 0, np.max(np.where(np.isfinite(scores), scores, -np.inf), -1), 0.0)
  e = np.where(np.isfinite(scores), np.exp(scores - mx[..., None]), 0.0)
  top = np.sort(e, axis=-1)[..., ::-1]
  picks = np.arange(e.shape[-1]) < (want_count - 1)[..., None]
  want_cov = np.where(n_elig > 0, (top * picks).sum(-1) / np.maximum(e.sum(-1), 1e-300), 1.0)
  want_cov = np.where(nonpad, want_cov, 1.0)
  cov = np.asarray(sel.coverage_BTG)
  np.testing.assert_allclose(cov, want_cov, rtol=1e-4, atol=1e-6)
  assert np.any(want_cov[1] < 0.99), "row 1 should leave unchosen mass"
  row = np.asarray(moba_coverage(q, k, seg, budget, block_size=16, k_max=k_max))
  # A row's coverage: the mean over its non-padding tokens and KV groups.
  want_row = [want_cov[i][nonpad[i, :, 0]].mean() for i in range(2)]
  np.testing.assert_allclose(row, want_row, rtol=1e-4, atol=1e-6)
  full = moba_coverage(q, k, seg, jnp.asarray([8, 8]), block_size=16, k_max=8)
  np.testing.assert_array_equal(np.asarray(full), 1.0)


def _curve_inputs(rng):
  """q, k and segment ids of three rows of 8 blocks of 16: one document, packed documents,
  and a document followed by padding."""
  q = jnp.asarray(rng.standard_normal((3, 128, 4, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((3, 128, 2, 16)), jnp.float32)
  seg = jnp.stack([jnp.ones((128,), jnp.int32),
                   packed_segments(rng, 1, 128, 16, aligned=False)[0],
                   jnp.where(jnp.arange(128) < 72, 1, 0).astype(jnp.int32)])
  return q, k, seg


def test_coverage_curve_is_the_coverage_at_every_budget():
  """moba_coverage_curve's column j is moba_coverage at budget j + 1, for rows of one document,
  packed documents, and padding; it rises with the budget and reaches 1 once every eligible
  block is chosen."""
  q, k, seg = _curve_inputs(np.random.default_rng())
  k_max = 8  # 8 blocks of 16: at budget 8 every earlier block is chosen
  curve = np.asarray(gating.moba_coverage_curve(q, k, seg, block_size=16, k_max=k_max))
  assert curve.shape == (3, k_max)
  for budget in range(1, k_max + 1):
    want = moba_coverage(q, k, seg, jnp.full((3,), budget, jnp.int32), block_size=16,
                         k_max=k_max)
    np.testing.assert_allclose(curve[:, budget - 1], np.asarray(want), rtol=1e-5, atol=1e-6,
                               err_msg=f"budget {budget}")
  assert np.all(np.diff(curve, axis=1) >= -1e-6)
  np.testing.assert_allclose(curve[:, -1], 1.0, rtol=1e-6)  # a row mean of 1s, in float32
  # Rows 0 and 2 have tokens with several earlier blocks; row 1's documents may be too short.
  assert np.all(curve[[0, 2], 1] < 0.99), "budget 2 should leave unchosen mass"


@pytest.mark.parametrize("stride", [3, 16])
def test_coverage_curve_over_strided_queries_is_their_mean(stride):
  """With query_stride s, the curve is the mean of moba_gate's per-token coverage over the
  non-padding tokens 0, s, 2s, ... (q given at those tokens only), at every budget - a stride
  that does not divide T included - for one document, packed documents and padding."""
  q, k, seg = _curve_inputs(np.random.default_rng())
  k_max = 8
  curve = np.asarray(gating.moba_coverage_curve(q[:, ::stride], k, seg, block_size=16,
                                                k_max=k_max, query_stride=stride))
  sampled = np.asarray(seg)[:, ::stride] != 0
  for budget in range(1, k_max + 1):
    sel = moba_gate(q, k, seg, jnp.full((3,), budget, jnp.int32), block_size=16, k_max=k_max)
    per_token = np.asarray(sel.coverage_BTG, np.float64).mean(-1)[:, ::stride]
    want = (per_token * sampled).sum(1) / sampled.sum(1)
    np.testing.assert_allclose(curve[:, budget - 1], want, rtol=1e-5, atol=1e-6,
                               err_msg=f"budget {budget}")
  assert curve[0, 1] < 0.99, "budget 2 should leave unchosen mass"


def test_coverage_curve_checks_the_strided_query_length():
  rng = np.random.default_rng()
  q, k = _inputs(rng, b=1)
  seg = jnp.ones((1, 128), jnp.int32)
  with pytest.raises(ValueError, match="query_stride=4 over T=128 takes 32"):
    gating.moba_coverage_curve(q, k, seg, block_size=16, k_max=3, query_stride=4)
  with pytest.raises(ValueError, match="query_stride must be >= 1"):
    gating.moba_coverage_curve(q, k, seg, block_size=16, k_max=3, query_stride=0)


_SPLIT = [1] * 40 + [2] * 40 + [1] * 48  # document 1 interrupted by document 2


@pytest.mark.parametrize("bad, match", [
    (dict(t=120), "multiple of block_size"),
    (dict(hq=3), "Hq % Hkv"),
    (dict(k_max=9), "k_max"),
    (dict(d=80), "head_dim D=80 must be a power of two"),
    (dict(d=8), "head_dim D=8 must be a power of two >= 16"),
    (dict(seg=[0] * 64 + [-1] * 64), r"segment_ids_BT must be >= 0.*rows \[0\]"),
    (dict(seg=_SPLIT), r"segment_ids_BT row 0: document ids \[1\].*only padding may"),
    (dict(seg=[2] * 40 + [0] * 40 + [1] * 8 + [0] * 8 + [2] * 32),
     r"segment_ids_BT row 0: document ids \[2\]"),
    # int64 ids past int32 (2^32 + 1 would read as 1, merging two documents).
    (dict(seg64=[1] * 64 + [2 ** 32 + 1] * 64), r"segment_ids_BT must fit int32.*rows \[0\]"),
])
def test_validation_errors_name_the_argument(bad, match):
  rng = np.random.default_rng()
  t, hq, k_max, d = bad.get("t", 128), bad.get("hq", 4), bad.get("k_max", 3), bad.get("d", 16)
  q = jnp.asarray(rng.standard_normal((1, t, hq, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, t, 2, d)), jnp.float32)
  seg = (np.asarray([bad["seg64"]], np.int64) if "seg64" in bad
         else jnp.asarray([bad.get("seg", [1] * t)], jnp.int32))
  with pytest.raises(ValueError, match=match):
    moba_gate(q, k, seg, jnp.asarray([2]), block_size=16, k_max=k_max)
  v = jnp.zeros_like(k)
  with pytest.raises(ValueError, match=match):  # the kernels' entry checks the same
    moba_attention(q, k, v, seg, jnp.asarray([2]), block_size=16, k_max=k_max, interpret=True)


def test_segment_rule_allows_padding_between_documents_and_any_id_order():
  # Padding between two documents or inside one, ids out of order, a row of padding only.
  gating.check_segments(np.array([[3] * 40 + [0] * 8 + [1] * 16 + [2] * 64, [0] * 128,
                                  [1] * 40 + [0] * 40 + [1] * 48]))


def test_budget_out_of_range_raises_eagerly_and_poisons_under_jit():
  rng = np.random.default_rng()
  q, k = _inputs(rng, b=2)
  seg = jnp.ones((2, 128), jnp.int32)
  with pytest.raises(ValueError, match="budget_B"):
    moba_gate(q, k, seg, jnp.asarray([0, 2]), block_size=16, k_max=3)
  with pytest.raises(ValueError, match="budget_B"):
    moba_gate(q, k, seg, jnp.asarray([2, 4]), block_size=16, k_max=3)
  gate = jax.jit(lambda b: moba_gate(q, k, seg, b, block_size=16, k_max=3).coverage_BTG)
  assert np.all(np.isfinite(gate(jnp.asarray([1, 3]))))
  cov = np.asarray(gate(jnp.asarray([1, 4])))  # traced: the bad row is poisoned with NaN
  assert np.all(np.isfinite(cov[0])) and np.all(np.isnan(cov[1]))


@pytest.mark.parametrize("dtype, hq, hkv, k_max", [(jnp.float32, 4, 2, 4),
                                                   (jnp.bfloat16, 2, 2, 3),
                                                   (jnp.float32, 7, 1, 12)])
def test_fused_gate_kernel_matches_gate(dtype, hq, hkv, k_max):
  """The Pallas gate (interpret mode) ranks exactly like moba_gate, slot by slot."""
  rng = np.random.default_rng()
  t, block_size = 256, 16
  q = jnp.asarray(rng.standard_normal((2, t, hq, 16)), dtype)
  k = jnp.asarray(rng.standard_normal((2, t, hkv, 16)), dtype)
  seg = packed_segments(rng, 2, t, block_size, aligned=False)
  budget = ragged_budgets(rng, 2, 1, k_max)
  want = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
  got = jax.jit(lambda q, k: gating.fused_gate(
      q, k, seg, budget, block_size=block_size, k_max=k_max, interpret=True))(q, k)
  np.testing.assert_array_equal(np.asarray(got.selected_BTGK), np.asarray(want.selected_BTGK))
  np.testing.assert_array_equal(np.asarray(got.count_BTG), np.asarray(want.count_BTG))


@pytest.mark.parametrize("num_picks", [2, 6])  # passes unrolled, looped
def test_gate_kernel_makes_each_rows_passes_only(num_picks):
  """moba_gate_topk with picks_B: row b's first picks_B[b] slots are the unbounded kernel's,
  its later slots -1 (passes clipped to [0, num_picks]); one compile serves every picks_B."""
  rng = np.random.default_rng()
  b, t, block_size = 4, 256, 16
  q = jnp.asarray(rng.standard_normal((b, t, 2, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, t, 1, 16)), jnp.float32)
  seg = packed_segments(rng, b, t, block_size, aligned=False)
  ops = gating.gate_kernel_operands(q, k, seg, block_size=block_size)
  traces = []

  def topk(picks_B):
    traces.append(1)
    return gating.moba_gate_topk(*ops, seg, block_size=block_size, num_picks=num_picks,
                                  interpret=True, picks_B=picks_B)

  bounded = jax.jit(topk)
  full = np.asarray(gating.moba_gate_topk(*ops, seg, block_size=block_size,
                                          num_picks=num_picks, interpret=True))
  assert all((full[row, ..., 0] >= 0).any() for row in range(b))  # every row picks
  for picks in ([0, 1, num_picks, 9], list(rng.integers(-1, num_picks + 2, size=b))):
    got = np.asarray(bounded(jnp.asarray(picks, jnp.int32)))
    for row, p in enumerate(picks):
      p = int(np.clip(p, 0, num_picks))
      np.testing.assert_array_equal(got[row, ..., :p], full[row, ..., :p])
      assert np.all(got[row, ..., p:] == -1)
  assert len(traces) == 1


@pytest.mark.parametrize("num_picks, tied", [(2, False), (6, False), (3, True)])
def test_gate_kernel_chunks_rank_as_one_pass(num_picks, tied):
  """moba_gate_topk over blocks in chunks (each program ranks one chunk; the chunks' picks
  merged by score after) picks exactly what one pass over every block picks and what the XLA
  gate picks, slot by slot - with ragged budgets, packed documents, and (tied) gate keys
  repeating every 16 blocks, so that equal scores fall in different chunks and the lower
  block must come first."""
  rng = np.random.default_rng()
  # 128 blocks (one chunk beside 64-token tiles by default), in 2 chunks of 64 and 8 of 16
  # beside 128-token tiles, which end mid-chunk and mid-block.
  b, t, block_size, hq, hkv = 2, 3072, 24, 2, 1
  n = t // block_size
  q = jnp.asarray(rng.standard_normal((b, t, hq, 16)), jnp.float32)
  k = rng.standard_normal((b, t, hkv, 16)).astype(np.float32)
  if tied:
    k = np.tile(k[:, :16 * block_size], (1, n // 16, 1, 1))
  k = jnp.asarray(k)
  seg = packed_segments(rng, b, t, block_size, aligned=False)
  if tied:  # one document, so that the repeated blocks' gate keys are equal too
    seg = jnp.ones((b, t), jnp.int32)
  ops = gating.gate_kernel_operands(q, k, seg, block_size=block_size)
  budget = ragged_budgets(rng, b, 1, num_picks + 1)
  run = lambda chunk, tile=128: np.asarray(jax.jit(lambda *ops: gating.moba_gate_topk(
      *ops, seg, block_size=block_size, num_picks=num_picks, interpret=True,
      picks_B=budget - 1, chunk=chunk, tile=tile))(*ops))
  one_pass = run(n, tile=64)
  if tied:  # ties across chunks do occur: some token's picks hold two equal gate keys
    gk = np.asarray(gating.gate_keys(k, seg, block_size=block_size)[0])
    assert np.array_equal(gk[:, :16], gk[:, 16:32])
  np.testing.assert_array_equal(run(None), one_pass)
  for chunk in (64, 16):
    np.testing.assert_array_equal(run(chunk), one_pass)
  want = moba_gate(q, k, seg, budget, block_size=block_size, k_max=num_picks + 1)
  got = gating.selection_from_picks(jnp.maximum(one_pass, 0), one_pass >= 0, seg, budget,
                                    block_size=block_size, num_blocks=n)
  np.testing.assert_array_equal(np.asarray(got.selected_BTGK), np.asarray(want.selected_BTGK))
  with pytest.raises(ValueError, match="chunk=24"):
    gating.moba_gate_topk(*ops, seg, block_size=block_size, num_picks=num_picks,
                          interpret=True, chunk=24)


def test_gate_kernel_chunks_blocks_by_default_from_256():
  """By default the gate ranks every block in one program up to 128 blocks and in chunks
  (a second kernel merging them) from 256, where one program would hold 32 tokens, for up to
  8 picks - and past 512 blocks for any number."""
  def kernels(num_blocks, num_picks=2):
    t = 8 * num_blocks
    q = jnp.zeros((1, t, 2, 16), jnp.float32)
    k = jnp.zeros((1, t, 1, 16), jnp.float32)
    seg = jnp.ones((1, t), jnp.int32)
    ops = gating.gate_kernel_operands(q, k, seg, block_size=8)
    jaxpr = jax.make_jaxpr(lambda *ops: gating.moba_gate_topk(
        *ops, seg, block_size=8, num_picks=num_picks, interpret=True))(*ops)
    return [str(e.params.get("name", e.params.get("name_and_src_info", "")))
            for e in jaxpr.eqns if e.primitive.name == "pallas_call"]

  assert len(kernels(128)) == 1
  assert len(kernels(256)) == 2 and "moba_gate_merge" in kernels(256)[1]
  assert len(kernels(256, num_picks=9)) == 1  # past 8 picks: one chunk
  assert len(kernels(1024, num_picks=9)) == 2  # unless no 16-token tile holds every block


@pytest.mark.gpu
@pytest.mark.parametrize("k_max", [3, 9])  # the merge's passes unrolled, looped
def test_gpu_compiled_gate_over_chunks_matches_gate(k_max):
  """The compiled gate at 256 blocks (four chunks of 64 and the merge kernel, the default
  there) against the XLA gate, ragged budgets, documents inside blocks: the same counts, and
  every slot the same block or (a near tie, the two programs' float32 sums differing in the
  last bits) one whose XLA gate score equals the wanted block's to 1e-5."""
  rng = np.random.default_rng()
  b, t, block_size, hq, hkv, d = 2, 4096, 16, 4, 2, 64
  n = t // block_size
  q = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.bfloat16)
  seg = packed_segments(rng, b, t, 8 * block_size, aligned=False)
  budget = jnp.asarray([k_max, 2], jnp.int32)
  got = jax.jit(lambda q, k: gating.fused_gate(q, k, seg, budget, block_size=block_size,
                                               k_max=k_max, interpret=False))(q, k)
  want = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
  np.testing.assert_array_equal(np.asarray(got.count_BTG), np.asarray(want.count_BTG))
  got_k, want_k = np.asarray(got.selected_BTGK), np.asarray(want.selected_BTGK)
  assert (want_k[..., 1:] < n).sum() > b * t  # later blocks are picked, in every chunk
  assert len(np.unique(want_k[want_k < n] // 64)) == n // 64
  scores = np.asarray(gating.gate_scores(q, k, seg, block_size=block_size))
  at = lambda sel: np.take_along_axis(scores, np.minimum(sel, n - 1), axis=-1)
  differ = got_k != want_k
  assert differ.mean() < 1e-3
  scale = np.abs(scores[np.isfinite(scores)]).max()
  np.testing.assert_allclose(at(got_k)[differ], at(want_k)[differ], rtol=0, atol=1e-5 * scale)


def _dense_gate_scores_f64(q, k, seg, block_size):
  """The gate's definition in float64 numpy, apart from the package (no bf16 passes): [B, T, G,
  N] scores of (sum of the group's query heads) . (mean of block j's keys of the token's
  document), -inf where j is not an earlier block holding that document or the token is
  padding."""
  q, k, seg = np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(seg)
  b, t, hq, d = q.shape
  hkv, n = k.shape[2], t // block_size
  qg = q.reshape(b, t, hkv, hq // hkv, d).sum(3)
  same = ((seg[:, :, None, None] == seg.reshape(b, 1, n, block_size))
          & (seg != 0)[:, :, None, None])  # [B, T, N, P]
  cnt = same.sum(-1)
  ksum = np.einsum("btnp,bnpgd->btngd", same.astype(np.float64),
                   k.reshape(b, n, block_size, hkv, d))
  scores = np.einsum("btgd,btngd->btgn", qg, ksum / np.maximum(cnt, 1)[..., None, None])
  eligible = (np.arange(n)[None, None, :] < (np.arange(t) // block_size)[None, :, None]) & (cnt > 0)
  return np.where(eligible[:, :, None, :], scores, -np.inf)


def test_gate_scores_are_float32_accurate():
  """The gate scores in float32 to ~1e-5 of their scale (the three bf16 passes; one bf16 pass
  would be off by ~1e-3), against float64 numpy built apart from the package - the dense
  reference's own gate scores run through the same gate_dot, so only this sees its precision -
  and the Pallas gate's picks hold the float64 ranking's scores to that bound. A block of
  padding only lies inside a document: the padding tokens after it find nothing eligible."""
  rng = np.random.default_rng()
  b, t, block_size, k_max = 2, 256, 16, 4
  q = jnp.asarray(rng.standard_normal((b, t, 4, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, t, 2, 16)), jnp.float32)
  seg = np.array(packed_segments(rng, b, t, block_size, aligned=False))
  seg[1] = np.where((np.arange(t) >= 100) & (np.arange(t) < 150), 0, 1)  # blocks 7, 8: padding
  seg = jnp.asarray(seg)
  want = _dense_gate_scores_f64(q, k, seg, block_size)
  got = np.asarray(gating.gate_scores(q, k, seg, block_size=block_size), np.float64)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
  assert not np.isfinite(want[1, 100:150]).any() and np.isfinite(want[1, 160]).any()
  fin = np.isfinite(want)
  scale = np.abs(want[fin]).max()
  np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=1e-4 * scale)
  # The Pallas gate: slot s's block has the float64 score of the s-th best eligible block.
  budget = jnp.asarray([k_max, k_max], jnp.int32)
  sel = jax.jit(lambda q, k: gating.fused_gate(q, k, seg, budget, block_size=block_size,
                                               k_max=k_max, interpret=True))(q, k)
  picks = np.asarray(sel.selected_BTGK)[..., 1:]
  used = picks < t // block_size
  best = -np.sort(-want, axis=-1)[..., :k_max - 1]
  np.testing.assert_array_equal(used, np.isfinite(best))
  at = np.take_along_axis(want, np.minimum(picks, t // block_size - 1), axis=-1)
  assert used.sum() > b * t
  np.testing.assert_allclose(at[used], best[used], rtol=0, atol=1e-4 * scale)


def test_coverage_is_exactly_one_once_every_eligible_block_is_chosen():
  """A token whose budget takes every eligible block (or that has none) gets coverage exactly
  1.0 - not a float32 ratio of two sums in different orders, a hair off - at every budget,
  per token (a row mean of 128 such values would round the hair away)."""
  rng = np.random.default_rng()
  q, k = _inputs(rng)
  seg = jnp.stack([packed_segments(rng, 1, 128, 16, aligned=False)[0],
                   jnp.ones((128,), jnp.int32)])
  n_elig = np.isfinite(np.asarray(gating.gate_scores(q, k, seg, block_size=16))).sum(-1)
  k_max, checked = 8, 0
  for budget in range(1, k_max + 1):
    sel = moba_gate(q, k, seg, jnp.full((2,), budget, jnp.int32), block_size=16, k_max=k_max)
    all_chosen = n_elig <= budget - 1
    cov = np.asarray(sel.coverage_BTG)
    np.testing.assert_array_equal(cov[all_chosen], 1.0, err_msg=f"budget {budget}")
    checked += int((n_elig == budget - 1).sum())
  assert checked == n_elig.size


def test_row_coverage_is_exactly_one_under_jit_once_every_block_is_chosen():
  """A row's mean of per-token coverages that are all exactly 1 is exactly 1 under jit too
  (XLA may divide by the token count as a product with its reciprocal: 121 x fl(1/121) is a
  hair below 1, and a coverage floor of 1.0 would never be met), over 7 KV groups as well;
  and an out-of-range budget gives NaN even on a row of padding only."""
  rng = np.random.default_rng()
  q, k = _inputs(rng, b=2, t=128, hq=7, hkv=7)
  seg = np.zeros((2, 128), np.int32)
  seg[0, 7:] = 1  # one document of 121 tokens; row 1 is padding only
  seg = jnp.asarray(seg)
  every = jnp.array([8, 8], jnp.int32)
  cov = jax.jit(lambda q, k: moba_coverage(q, k, seg, every, block_size=16, k_max=8))(q, k)
  np.testing.assert_array_equal(np.asarray(cov), [1.0, 1.0])
  curve = jax.jit(lambda q, k: gating.moba_coverage_curve(q, k, seg, block_size=16,
                                                          k_max=8))(q, k)
  np.testing.assert_array_equal(np.asarray(curve)[:, -1], [1.0, 1.0])
  bad = jax.jit(lambda q, k, b: moba_coverage(q, k, seg, b, block_size=16, k_max=8))(
      q, k, jnp.array([2, 0], jnp.int32))
  assert np.isfinite(bad[0]) and np.isnan(bad[1]), bad


def test_block_size_and_kernel_settings_errors_name_them():
  """A block smaller than the key tiles shrinks them to it: a block that cannot be a tile is
  named as block_size (the user set no tile); warps and stages must be positive."""
  q = jnp.zeros((1, 96, 2, 16), jnp.float32)
  k = jnp.zeros((1, 96, 1, 16), jnp.float32)
  seg, budget = jnp.ones((1, 96), jnp.int32), jnp.asarray([1], jnp.int32)
  with pytest.raises(ValueError, match=r"block_size=48 must be a power of two >= 16"):
    moba_attention(q, k, k, seg, budget, block_size=48, k_max=1, interpret=True)
  from pallas_kernels.moba import MobaBlockSizes
  with pytest.raises(ValueError, match=r"MobaBlockSizes.num_stages_bwd=0 must be >= 1"):
    moba_attention(q, k, k, seg, budget, block_size=32, k_max=1, interpret=True,
                   block_sizes=MobaBlockSizes(num_stages_bwd=0))
