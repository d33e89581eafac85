"""relaxed_atomic_add: repeated indices accumulate, masked lanes add nothing, the ref's other
elements keep their values - in interpret mode on CPU, and compiled on the GPU (marked)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_kernels.moba.relaxed_atomics import relaxed_atomic_add


def _scatter_add(idx_PR, val_PRD, keep_PR, base_ND, *, interpret):
  """One program per leading index p: base[idx[p, r], :] += val[p, r, :] where keep[p, r]."""
  p, r, d = val_PRD.shape

  def kernel(idx_ref, val_ref, keep_ref, _, out_ref):
    relaxed_atomic_add(out_ref, (idx_ref[...], slice(None)), val_ref[...],
                       mask=(keep_ref[...] != 0)[:, None])

  rows = lambda *shape: pl.BlockSpec((None, *shape), lambda i: (i,) + (0,) * len(shape))
  whole = pl.BlockSpec(base_ND.shape, lambda i: (0, 0))
  return pl.pallas_call(
      kernel, grid=(p,), in_specs=[rows(r), rows(r, d), rows(r), whole], out_specs=whole,
      out_shape=jax.ShapeDtypeStruct(base_ND.shape, jnp.float32), input_output_aliases={3: 0},
      interpret=interpret)(idx_PR, val_PRD, keep_PR, base_ND)


def _check(interpret, p, r, n, d):
  rng = np.random.default_rng()
  idx = rng.integers(0, n, size=(p, r)).astype(np.int32)
  idx[:, 1] = idx[:, 0]  # a repeat inside each program, besides those across programs
  val = rng.standard_normal((p, r, d)).astype(np.float32)
  keep = rng.integers(0, 2, size=(p, r)).astype(np.int32)
  base = rng.standard_normal((n, d)).astype(np.float32)
  want = base.astype(np.float64).copy()
  np.add.at(want, idx[keep != 0], val[keep != 0])
  got = jax.jit(lambda *a: _scatter_add(*a, interpret=interpret))(idx, val, keep, base)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_accumulates_repeats_and_honours_mask_interpret():
  _check(True, p=3, r=8, n=10, d=16)


@pytest.mark.gpu
def test_accumulates_repeats_and_honours_mask_gpu():
  _check(False, p=64, r=32, n=40, d=64)  # many programs adding into the same 40 rows
