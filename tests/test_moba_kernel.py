"""MoBA Pallas kernels (interpret mode on CPU) vs the dense reference: values, gradients,
packing, edge cases, poisoned outputs, no recompilation; GPU-marked checks for H200."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.moba import (MobaBlockSizes, attention, build_kv_layout, kernels,
                                 moba_attention, moba_gate, moba_reference)
from tests.test_moba_gate import packed_segments

# Relative L2 error bounds, fixed per dtype (bf16: operands rounded to 8 bits): over the whole
# tensor (TOL) and for the worst (token, head) row against the reference's RMS row (ROW_TOL).
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
ROW_TOL = {jnp.float32: 1e-4, jnp.bfloat16: 8e-2}
# Masks everywhere (the default's choice at head_dim > 64); the skipping path has its own cases.
SMALL = MobaBlockSizes(block_rows=16, block_k=16, block_k_dkv=16, skip_full_masks=False)


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert np.all(np.isfinite(a)), "non-finite values"
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def row_err(a, b):
  """The largest error of one row (last axis: a token's head) over the RMS norm of the
  reference's rows: a wrong or zeroed token shows here, where the whole tensor's error may
  hide a few."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert np.all(np.isfinite(a)), "non-finite values"
  scale = np.sqrt(np.mean(np.sum(b * b, axis=-1)))
  return np.linalg.norm(a - b, axis=-1).max() / max(scale, 1e-30)


def assert_close(got, want, dtype, names=("out", "dq", "dk", "dv"), tol=None, row_tol=None):
  """Each of got's arrays within the dtype's bounds of want's, over the tensor and per row."""
  tol = TOL[dtype] if tol is None else tol
  row_tol = ROW_TOL[dtype] if row_tol is None else row_tol
  for name, g, w in zip(names, got, want):
    assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
    errs = rel_err(g, w), row_err(g, w)
    assert errs[0] < tol and errs[1] < row_tol, (name, errs)


def own_block_attention(q, k, v, seg, block_size):
  """Each token attending only within its own block (causal, its own document; query head h
  on KV head h // (Hq / Hkv)) in float64 numpy, built apart from the package: the function at
  k_b = 1, and for the first block's tokens at any budget. Padding tokens give zeros."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  seg = np.asarray(seg)
  t, hq, d = q.shape[1:]
  gh = hq // k.shape[2]
  k, v = np.repeat(k, gh, axis=2), np.repeat(v, gh, axis=2)
  pos = np.arange(t)
  near = (pos[None, :] <= pos[:, None]) & (pos[:, None] // block_size == pos[None, :] // block_size)
  ok_BQK = near[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)
  s = np.where(ok_BQK[:, None], np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d), -np.inf)
  m = np.max(s, axis=-1, keepdims=True)
  p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
  denom_BQH = np.maximum(p.sum(-1), 1e-300).transpose(0, 2, 1)
  o = np.einsum("bhqk,bkhd->bqhd", p, v) / denom_BQH[..., None]
  return np.where((seg != 0)[:, :, None, None], o, 0.0)


def make_inputs(rng, b, t, hq, hkv, d, dtype):
  def n(*shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)
  return n(b, t, hq, d), n(b, t, hkv, d), n(b, t, hkv, d), n(b, t, hq, d)


def run_both(q, k, v, do, seg, budget, block_size, k_max, bs=SMALL, interpret=True,
             backend="triton"):
  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
  kern = lambda q, k, v: moba_attention(q, k, v, seg, budget, block_size=block_size,
                                        k_max=k_max, block_sizes=bs,
                                        backend=backend, interpret=interpret)
  ref = lambda q, k, v: moba_reference(q, k, v, seg, budget, block_size=block_size, k_max=k_max)
  # One jitted program per side: eager dispatch would compile every small op.
  both = lambda fn: jax.jit(lambda q, k, v: (fn(q, k, v),
                                             *jax.grad(loss(fn), argnums=(0, 1, 2))(q, k, v)))
  got = both(kern)(q, k, v)
  assert got[0].dtype == q.dtype and got[0].shape == q.shape
  return got, both(ref)(q, k, v)


# aligned: documents packed at block starts (the training pipeline's packing), else anywhere,
# so that blocks hold the end of one document and the start of the next.
@pytest.mark.parametrize("dtype, hq, hkv, bs, aligned", [
    (jnp.float32, 2, 2, SMALL, False), (jnp.float32, 14, 2, SMALL, True),
    (jnp.bfloat16, 4, 2, SMALL, False), (jnp.bfloat16, 14, 2, SMALL, False),
    (jnp.float32, 2, 1, dataclasses.replace(SMALL, skip_full_masks=True), None)],
    ids=["f32-1-unaligned", "f32-7-aligned", "bf16-2-unaligned", "bf16-7-unaligned",
         "f32-2-skip_full_masks"])
def test_values_and_gradients_match_reference(dtype, hq, hkv, bs, aligned):
  rng = np.random.default_rng()
  # Two key tiles per block: exercises the causal tile bound and the dk/dv chunk skip.
  b, t, block_size, k_max = 3, 192, 32, 3
  q, k, v, do = make_inputs(rng, b, t, hq, hkv, 16, dtype)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(aligned))
  if bs.skip_full_masks:  # long documents: most chunks are full (test_moba_gate checks which)
    seg = jnp.asarray([[1] * 150 + [0] * 42, [1] * 100 + [2] * 92, [3] * 192])
  budget = jnp.asarray(rng.permutation([1, 2, 3]), jnp.int32)  # ragged: every row its own
  if bs.skip_full_masks:  # every row selects: full chunks exist
    budget = jnp.asarray(rng.permutation([2, 3, int(rng.integers(2, k_max + 1))]), jnp.int32)
  got, want = run_both(q, k, v, do, seg, budget, block_size, k_max, bs=bs)
  assert_close(got, want, dtype)
  # The first block sees nothing but itself, whatever the budget.
  first = own_block_attention(q, k, v, seg, block_size)[:, :block_size]
  assert rel_err(got[0][:, :block_size], first) < TOL[dtype]
  pad = np.asarray(seg) == 0
  assert np.all(np.asarray(got[0], np.float32)[pad] == 0)
  assert np.all(np.asarray(got[1], np.float32)[pad] == 0)


def test_no_leakage_across_documents():
  rng = np.random.default_rng()
  t, block_size = 128, 32
  q, k, v, _ = make_inputs(rng, 1, t, 2, 1, 16, jnp.float32)
  # Document 2 starts inside block 2 (tokens 64..95), beside document 1's last tokens, and is
  # followed by padding: only the same-document mask keeps document 1 out of its own block.
  seg = jnp.asarray([[1] * 70 + [2] * 40 + [0] * 18], jnp.int32)
  budget = jnp.asarray([4], jnp.int32)

  def doc2_out(q, k, v):
    o = moba_attention(q, k, v, seg, budget, block_size=block_size, k_max=4,
                       block_sizes=SMALL, interpret=True)
    return jnp.sum(jnp.where((seg == 2)[..., None, None], o, 0.0) ** 2)

  dq, dk, dv = jax.jit(jax.grad(doc2_out, argnums=(0, 1, 2)))(q, k, v)
  other = np.asarray(seg)[0] != 2
  for g in (dq, dk, dv):
    assert np.all(np.asarray(g)[0][other] == 0.0)
    assert np.any(np.asarray(g)[0][~other] != 0.0)


@pytest.mark.parametrize("case", ["k1", "all_eligible", "one_block"])
def test_edge_cases(case):
  rng = np.random.default_rng()
  t, block_size, k_max, budget = {"k1": (64, 16, 3, [1, 1]),
                                  "all_eligible": (64, 16, 4, [4, 4]),
                                  "one_block": (32, 32, 1, [1, 1])}[case]
  q, k, v, do = make_inputs(rng, 2, t, 2, 2, 16, jnp.float32)
  seg = jnp.asarray(np.stack([np.ones(t), np.r_[np.ones(t - 5), np.zeros(5)]]), jnp.int32)
  got, want = run_both(q, k, v, do, seg, jnp.asarray(budget, jnp.int32), block_size, k_max)
  assert_close(got, want, jnp.float32)
  own = own_block_attention(q, k, v, seg, block_size)
  assert np.allclose(got[0][:, 0], v[:, 0], rtol=1e-5, atol=1e-6)  # token 0 sees itself only
  assert rel_err(got[0][:, :block_size], own[:, :block_size]) < TOL[jnp.float32]
  if case != "all_eligible":  # own block only: block-diagonal causal attention everywhere
    assert rel_err(got[0], own) < TOL[jnp.float32]
  else:  # the later blocks' tokens see more than their own block
    assert rel_err(got[0][:, block_size:], own[:, block_size:]) > 1e-2


def test_kernel_outputs_poisoned_and_fully_written():
  """Interpret mode fills kernel outputs with NaN first: every row the combine reads,
  and every dk/dv element, must be overwritten."""
  rng = np.random.default_rng()
  t, block_size, k_max = 64, 16, 3
  q, k, v, do = make_inputs(rng, 1, t, 2, 1, 16, jnp.float32)
  seg = jnp.asarray([[1] * 40 + [0] * 8 + [2] * 16], jnp.int32)
  budget = jnp.asarray([3], jnp.int32)

  @jax.jit
  def layout_and_fwd(q, k, v):
    sel = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
    layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2, block_rows=16)
    return layout, *kernels.moba_forward_rows(
        q.reshape(1, t * 2, 16), layout, k, v, seg, block_size=block_size, bs=SMALL,
        interpret=True)

  layout, o_rows, lse_rows = layout_and_fwd(q, k, v)
  q_flat, lse_flat = q.reshape(1, t * 2, 16), jnp.zeros((1, t * 2), jnp.float32)
  used = np.asarray(layout.chunk_block_BGC)[0, 0] >= 0
  o_chunks = np.asarray(o_rows)[0, 0].reshape(-1, 16, 16)
  assert np.all(np.isfinite(o_chunks[used])) and np.all(np.isnan(o_chunks[~used]))
  lse_chunks = np.asarray(lse_rows)[0, 0].reshape(-1, 16)
  assert np.all(np.isfinite(lse_chunks[used])) and np.all(np.isnan(lse_chunks[~used]))
  dq_rows = kernels.moba_dq_rows(q_flat, q_flat, lse_flat, lse_flat, layout, k, v, seg,
                                 block_size=block_size, bs=SMALL, interpret=True)
  dq_chunks = np.asarray(dq_rows)[0, 0].reshape(-1, 16, 16)
  assert np.all(np.isfinite(dq_chunks[used])) and np.all(np.isnan(dq_chunks[~used]))
  dk, dv = kernels.moba_dkv(q_flat, q_flat, lse_flat, lse_flat, layout, k, v, seg,
                            block_size=block_size, bs=SMALL, interpret=True)
  assert np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
  attn = jax.jit(lambda q, k, v: moba_attention(q, k, v, seg, budget, block_size=block_size,
                                                k_max=k_max, block_sizes=SMALL, interpret=True))
  out = attn(q, k, v)
  assert np.all(np.isfinite(out))


def backend_compiles(fn):
  """How many XLA compilations fn() runs (JAX's backend-compile events: a path that retraces
  nothing but compiles again shows here)."""
  events = []

  def listener(event, secs, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      events.append(secs)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    jax.block_until_ready(fn())
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return len(events)


def test_budget_change_does_not_recompile():
  rng = np.random.default_rng()
  q, k, v, do = make_inputs(rng, 2, 64, 2, 2, 16, jnp.float32)
  seg = jnp.ones((2, 64), jnp.int32)
  attn = lambda budget: moba_attention(q, k, v, seg, budget, block_size=16, k_max=4,
                                       block_sizes=SMALL, interpret=True)
  # Forward and backward, jitted as a training step is: one compilation serves every budget.
  step = jax.jit(lambda budget: jax.value_and_grad(
      lambda q: jnp.sum(moba_attention(q, k, v, seg, budget, block_size=16, k_max=4,
                                       block_sizes=SMALL, interpret=True) * do))(q))
  budgets = [jnp.asarray(b, jnp.int32) for b in ([1, 2], [4, 4], [3, 1])]
  assert backend_compiles(lambda: step(budgets[0])) >= 1
  outs = []
  assert backend_compiles(lambda: [outs.append(step(b)) for b in budgets[1:]]) == 0
  assert np.isfinite(outs[0][1]).all() and np.isfinite(outs[1][1]).all()
  assert not np.allclose(outs[0][1], outs[1][1])
  # Called eagerly, a new budget compiles no more than the same budget again (interpret mode
  # compiles its kernels per eager call either way).
  jax.block_until_ready(attn(budgets[0]))
  assert backend_compiles(lambda: attn(budgets[1])) == backend_compiles(lambda: attn(budgets[0]))


def test_budget_out_of_range_is_an_error():
  rng = np.random.default_rng()
  q, k, v, _ = make_inputs(rng, 2, 64, 2, 2, 16, jnp.float32)
  seg = jnp.ones((2, 64), jnp.int32)
  with pytest.raises(ValueError, match="budget_B"):
    moba_attention(q, k, v, seg, jnp.asarray([5, 1]), block_size=16, k_max=4, interpret=True)
  f = jax.jit(lambda b: moba_attention(q, k, v, seg, b, block_size=16, k_max=4,
                                       block_sizes=SMALL, interpret=True))
  out = np.asarray(f(jnp.asarray([0, 2], jnp.int32)))  # traced: the bad row is NaN
  assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1]))


def test_chunk_wrongly_marked_full_changes_the_result():
  """The unmasked path really skips the mask: a chunk marked full that is not (here every
  used chunk, own blocks included) gives different partial outputs."""
  rng = np.random.default_rng()
  t, block_size = 128, 32
  q, k, v, _ = make_inputs(rng, 1, t, 2, 1, 16, jnp.float32)
  seg = jnp.ones((1, t), jnp.int32)
  sel = moba_gate(q, k, seg, jnp.asarray([3]), block_size=block_size, k_max=3)
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2, block_rows=16)
  wrong = dataclasses.replace(
      layout, chunk_full_BGC=(layout.chunk_block_BGC >= 0).astype(jnp.int32))
  bs = dataclasses.replace(SMALL, skip_full_masks=True)
  run = lambda lay: kernels.moba_forward_rows(q.reshape(1, t * 2, 16), lay, k, v, seg,
                                              block_size=block_size, bs=bs, interpret=True)
  used = np.repeat(np.asarray(layout.chunk_block_BGC) >= 0, 16, axis=-1)
  right_o, wrong_o = np.asarray(run(layout)[0])[used], np.asarray(run(wrong)[0])[used]
  assert np.isfinite(right_o).all() and np.isfinite(wrong_o).all()
  assert not np.allclose(right_o, wrong_o)


def test_skip_full_masks_default_follows_head_dim():
  # None decides by head_dim (measured: faster at 64, slower at 128); an explicit choice stays.
  for d, skip in ((16, True), (64, True), (65, False), (96, False), (128, False)):
    assert MobaBlockSizes().fit(512, d).skip_full_masks is skip, d
  for explicit in (False, True):
    for d in (64, 128):
      assert MobaBlockSizes(skip_full_masks=explicit).fit(512, d).skip_full_masks is explicit
  fitted = MobaBlockSizes(block_k=128, block_k_dkv=128).fit(64, 128)
  assert (fitted.block_k, fitted.block_k_dkv) == (64, 64)
  assert fitted.fit(64, 64) == fitted  # idempotent: the kernels fit again


@pytest.mark.gpu
@pytest.mark.parametrize("skip_full_masks", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_compiled_kernels_match_reference(dtype, skip_full_masks):
  """The compiled Triton-lowered kernels, documents starting inside blocks (the same-document
  masks tested); with mask skipping, long documents so that most chunks are full."""
  rng = np.random.default_rng()
  b, t, block_size, k_max = 2, 1024, 128, 4
  q, k, v, do = make_inputs(rng, b, t, 8, 2, 64, dtype)
  if skip_full_masks:  # document 2 starts inside block 5; row 1 ends in padding
    seg = jnp.asarray([[1] * 700 + [2] * 324, [1] * 1000 + [0] * 24], jnp.int32)
  else:
    seg = packed_segments(rng, b, t, block_size, aligned=False)
  budget = jnp.asarray([2, 4], jnp.int32)
  got, want = run_both(q, k, v, do, seg, budget, block_size, k_max,
                       bs=MobaBlockSizes(skip_full_masks=skip_full_masks), interpret=False)
  assert_close(got, want, dtype)


def test_large_k_max_merges_by_the_slot_kernel():
  """From attention._SLOT_MERGE_MIN_K_MAX the forward and dq merges run in
  kernels.merge_partials (budgets below k_max, ragged, one row at k_max): values and
  gradients still match the reference, padding tokens still give zeros."""
  from pallas_kernels.moba import attention
  rng = np.random.default_rng()
  b, t, block_size, k_max = 2, 512, 32, attention._SLOT_MERGE_MIN_K_MAX
  q, k, v, do = make_inputs(rng, b, t, 4, 2, 16, jnp.float32)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(rng.integers(2)))
  budget = jnp.asarray([3, k_max], jnp.int32)
  got, want = run_both(q, k, v, do, seg, budget, block_size, k_max)
  assert_close(got, want, jnp.float32)
  pad = np.asarray(seg) == 0
  assert np.all(np.asarray(got[0])[pad] == 0) and np.all(np.asarray(got[1])[pad] == 0)


@pytest.mark.parametrize("hq, hkv, k_max, budget", [(2, 1, 4, [4, 2]), (7, 1, 5, [2, 3]),
                                                    (4, 2, 3, [1, 3])])
def test_merge_partials_reads_used_slots_only(hq, hkv, k_max, budget):
  """merge_partials combines exactly the used slots of each (token, head): the log-sum-exp
  merge of their partial outputs (forward) and the sum of their partial dq, against numpy
  over the selection; rows of unused slots hold NaN (a read of one would show); padding
  tokens give 0 and lse 0; a row whose budget is out of range gives NaN outputs."""
  rng = np.random.default_rng()
  b, t, block_size, d = 2, 256, 32, 32
  q, k, _, _ = make_inputs(rng, b, t, hq, hkv, d, jnp.float32)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(rng.integers(2)))
  sel = moba_gate(q, k, seg, jnp.asarray(budget, jnp.int32), block_size=block_size,
                  k_max=k_max)
  gh = hq // hkv
  layout = build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=gh, block_rows=16)
  _, g, l = layout.row_src_BGL.shape
  entry = np.asarray(layout.entry_row_BGTK)
  count = np.asarray(sel.count_BTG)
  written = np.zeros((b, g, l), bool)
  for bi, ti, gi in zip(*np.nonzero(count)):
    for s in range(count[bi, ti, gi]):
      written[bi, gi, entry[bi, gi, ti, s]:entry[bi, gi, ti, s] + gh] = True
  part = np.where(written[..., None], rng.standard_normal((b, g, l, d)), np.nan).astype(np.float32)
  lse = np.where(written, rng.uniform(-3.0, 3.0, size=(b, g, l)), np.nan).astype(np.float32)
  ok = jnp.asarray([True, False])
  out, out_lse = kernels.merge_partials(jnp.asarray(part), jnp.asarray(lse),
                                        layout.entry_row_BGTK, sel.count_BTG, ok,
                                        group_size=gh, interpret=True)
  dq = kernels.merge_partials(jnp.asarray(part), None, layout.entry_row_BGTK, sel.count_BTG,
                              None, group_size=gh, interpret=True)
  want = np.zeros((b, t, hq, d)), np.zeros((b, t, hq)), np.zeros((b, t, hq, d))
  for bi in range(b):
    for ti in range(t):
      for gi in range(g):
        for h in range(gh):
          rows = [entry[bi, gi, ti, s] + h for s in range(count[bi, ti, gi])]
          if not rows:
            continue
          ls = lse[bi, gi, rows].astype(np.float64)
          w = np.exp(ls - ls.max())
          want[0][bi, ti, gi * gh + h] = (w[:, None] * part[bi, gi, rows]).sum(0) / w.sum()
          want[1][bi, ti, gi * gh + h] = ls.max() + np.log(w.sum())
          want[2][bi, ti, gi * gh + h] = part[bi, gi, rows].sum(0)
  assert (count == 0).any() and (count > 1).any()
  np.testing.assert_allclose(np.asarray(out)[0], want[0][0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out_lse), want[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(dq), want[2], rtol=1e-5, atol=1e-5)
  assert np.isnan(np.asarray(out)[1]).all()  # budget out of range: NaN, whatever it read


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_dtypes_are_an_error(which):
  """q, k and v must share a dtype (bf16 or float32): a k or v of the other raises ValueError
  naming the arguments, before any kernel runs."""
  rng = np.random.default_rng()
  q, k, v, _ = make_inputs(rng, 1, 64, 2, 2, 16, jnp.float32)
  k, v = (k.astype(jnp.bfloat16), v) if which == "k" else (k, v.astype(jnp.bfloat16))
  seg = jnp.ones((1, 64), jnp.int32)
  with pytest.raises(ValueError, match="q_BTHD, k_BTKD, v_BTKD must share a dtype"):
    moba_attention(q, k, v, seg, jnp.asarray([2]), block_size=16, k_max=2, interpret=True)


def test_slot_merge_kernel_runs_from_its_k_max():
  """attention._merge's routing, which test_large_k_max_merges_by_the_slot_kernel's values
  cannot show: from _SLOT_MERGE_MIN_K_MAX the forward and dq merges are merge_partials'
  kernels (moba_merge, moba_merge_dq), below it neither runs (XLA's gather). Traced only."""
  k_max = attention._SLOT_MERGE_MIN_K_MAX
  t, block_size = 16 * k_max, 16
  q = jnp.zeros((1, t, 2, 16), jnp.float32)
  k = jnp.zeros((1, t, 1, 16), jnp.float32)
  seg = jnp.ones((1, t), jnp.int32)

  def merges(k_max):
    step = jax.grad(lambda q: jnp.sum(moba_attention(
        q, k, k, seg, jnp.asarray([2]), block_size=block_size, k_max=k_max, block_sizes=SMALL,
        interpret=True)))
    text = str(jax.make_jaxpr(step)(q))
    return [name for name in ("moba_merge_dq", "moba_merge")
            if re.search(rf"name={name}\b", text)]

  assert merges(k_max) == ["moba_merge_dq", "moba_merge"]
  assert merges(k_max - 1) == []


def test_padding_inside_a_document_with_mask_skipping():
  """Padding inside a document (the segment rule allows it) leaves a block of the document's
  keys and padding (block 2: 8 + 8); later tokens of the document choose it. With mask
  skipping such a chunk must not be marked full: its padding keys are never attended. Values
  and gradients against the reference, f32."""
  rng = np.random.default_rng()
  t, block_size, k_max = 128, 16, 8
  q, k, v, do = make_inputs(rng, 2, t, 4, 2, 16, jnp.float32)
  seg = jnp.asarray([[1] * 40 + [0] * 8 + [1] * 80, [2] * 24 + [0] * 8 + [1] * 96], jnp.int32)
  budget = jnp.asarray([k_max, k_max], jnp.int32)  # every eligible block chosen
  bs = dataclasses.replace(SMALL, skip_full_masks=True)
  sel = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
  assert (np.asarray(sel.selected_BTGK)[0, 48:, :, 1:] == 2).any(-1).all()  # block 2 is read
  got, want = run_both(q, k, v, do, seg, budget, block_size, k_max, bs=bs)
  assert_close(got, want, jnp.float32)
