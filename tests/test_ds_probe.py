"""experiments/ds_probe.py's dq_from_ds (the kernel whose GPU time BENCHMARKS.md reports)
against a float64 product, in interpret mode, on the work items of a real gate's layout."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from experiments.ds_probe import dq_from_ds
from pallas_kernels.moba import attention, hopper
from pallas_kernels.moba.kernels import MobaBlockSizes


def test_dq_from_ds_matches_the_product_over_each_items_key_steps():
  b, t, hq, hkv, d, blk = 1, 1024, 4, 2, 64, 256
  ks = jax.random.split(jax.random.PRNGKey(int(np.random.default_rng().integers(1 << 30))), 3)
  q = jax.random.normal(ks[0], (b, t, hq, d), jnp.bfloat16)
  k = jax.random.normal(ks[1], (b, t, hkv, d), jnp.bfloat16)
  seg = jnp.ones((b, t), jnp.int32)
  _, layout = attention.gate_and_layout(q, k, seg, jnp.array([3]), block_size=blk, k_max=3,
                                        bs=MobaBlockSizes(), interpret=True, backend="mosaic")
  ids, num, blocks, steps, _ = hopper.persistent_items(layout, seg, block_size=blk,
                                                       block_kv=hopper.DKV_TILE)
  steps = steps.max(-1)  # an item's key steps: its longer half's
  _, g, l = layout.row_src_BGL.shape
  ds = jax.random.normal(ks[2], (b, g, blk, l), jnp.bfloat16)
  out = np.asarray(dq_from_ds(ds, k, ids, num, blocks, steps, block_size=blk,
                              item_rows=hopper.ITEM_ROWS, tile=hopper.DKV_TILE,
                              interpret=True), np.float64)
  ds64, k64 = np.asarray(ds, np.float64), np.asarray(k, np.float64)
  ids, num, blocks, steps = map(np.asarray, (ids, num, blocks, steps))
  per_group, r, tile = l // hopper.ITEM_ROWS, hopper.ITEM_ROWS, hopper.DKV_TILE
  assert num[0] > 0 and set(steps[ids[:num[0]]]) == {1, 2}  # own-block items stop early
  for flat in ids[:num[0]]:
    i, (bi, gi) = flat % per_group, divmod(flat // per_group, g)
    rows = slice(i * r, (i + 1) * r)
    base = blocks[flat] * blk
    want = sum(ds64[bi, gi, m * tile:(m + 1) * tile, rows].T
               @ k64[bi, base + m * tile:base + (m + 1) * tile, gi]
               for m in range(steps[flat])) / math.sqrt(d)
    # A bf16 output of a float32 accumulation: half a bf16 ulp (2^-9 relative) of each value,
    # plus float32 summation order against the float64 sum.
    np.testing.assert_allclose(out[bi, gi, rows], want, rtol=2 ** -8,
                               atol=1e-5 * np.abs(want).max())
