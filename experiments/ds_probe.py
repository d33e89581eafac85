"""Would dq be cheaper from a stored dS? Times, on the layout of a real gate, the parts of the
Hopper backward that storing dS in the dk/dv kernel would change: today's dq kernel (which
also gathers dO's sorted rows for dk/dv), and in its place the gather of dO's sorted rows
(kernels.gather_rows) plus dq as a plain product of a stored bf16 dS with K (dq_from_ds
below, a Pallas Triton kernel, here on random dS); dk/dv for scale. GPU only.

    python -m experiments.ds_probe [--seq 32768] [--block 512] [--ks 3 8] [--heads h128]

Prints one table (ms per call: back to back, 20 calls, one wait; and synchronised, median of
10), and the dS buffer's size.
"""

import argparse
import functools
import json
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from experiments.bench_kernel import HEADS
from pallas_kernels.moba import attention, hopper
from pallas_kernels.moba.kernels import MobaBlockSizes
from sparsebalance_jax.balance.timing import time_call, time_pipelined


def _dq_from_ds_kernel(ids_ref, num_ref, blk_ref, steps_ref, ds_ref, k_ref, dq_ref, *,
                       items_per_group, num_groups, block_size, tile, sm_scale):
  """One work item: its rows' dq = sm_scale * sum over its key steps of dS^T[tile] K[tile]."""
  p = pl.program_id(0)
  rows, d = dq_ref.shape[2] // items_per_group, dq_ref.shape[-1]

  @pl.when(p < num_ref[0])
  def _():
    flat = ids_ref[p]
    i = lax.rem(flat, items_per_group)
    bg = lax.div(flat, items_per_group)
    b, g = lax.div(bg, num_groups), lax.rem(bg, num_groups)
    base = blk_ref[flat] * block_size
    mine = pl.ds(i * rows, rows)

    def step(m, acc):
      ds_KR = ds_ref[b, g, pl.ds(m * tile, tile), mine]
      k_KD = k_ref[b, pl.ds(base + m * tile, tile), g, :]
      return acc + plgpu.dot(ds_KR, k_KD, trans_a=True)

    acc = lax.fori_loop(0, steps_ref[flat], step, jnp.zeros((rows, d), jnp.float32))
    dq_ref[b, g, mine, :] = (acc * sm_scale).astype(dq_ref.dtype)


def dq_from_ds(ds_BGKL, k_BTKD, ids, num, blk, steps, *, block_size: int, item_rows: int,
               tile: int, interpret: bool, num_warps: int = 4, num_stages: int = 3):
  """Partial dq [B, G, L, D] in k's dtype per sorted row, from dS stored by the dk/dv kernel:
  ds_BGKL [B, G, block_size, L] holds, for each sorted row, its dS against every key of the
  block its run reads (unscaled; only the key tiles a row's work item attends need be
  written). Work items are runs of item_rows sorted rows (ids: their flat ids
  (b * G + g) * I + i, the used ones first, num of them; per flat id its block and its key
  steps of `tile` keys), one program each; rows of unused items are not written."""
  b, g, bs_, l = ds_BGKL.shape
  d = k_BTKD.shape[-1]
  if bs_ != block_size or l % item_rows or block_size % tile:
    raise ValueError(f"ds_BGKL {ds_BGKL.shape}: need [B, G, block_size={block_size}, L] with "
                     f"L % {item_rows} == 0 and block_size % tile={tile} == 0")
  kernel = functools.partial(_dq_from_ds_kernel, items_per_group=l // item_rows, num_groups=g,
                             block_size=block_size, tile=tile, sm_scale=1.0 / math.sqrt(d))
  return pl.pallas_call(
      kernel,
      grid=(ids.shape[0],),
      out_shape=jax.ShapeDtypeStruct((b, g, l, d), k_BTKD.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="moba_dq_from_ds",
  )(ids, num, blk, steps, ds_BGKL, k_BTKD)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--seq", type=int, default=32768)
  p.add_argument("--block", type=int, default=512)
  p.add_argument("--ks", type=int, nargs="+", default=[3, 8])
  p.add_argument("--heads", default="h128", choices=sorted(HEADS))
  p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
  p.add_argument("--stages", type=int, nargs="+", default=[3])
  p.add_argument("--out", default=None)
  a = p.parse_args()
  hq, hkv, d = HEADS[a.heads]
  t, blk = a.seq, a.block
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  q = jax.random.normal(ks[0], (1, t, hq, d), jnp.bfloat16)
  k = jax.random.normal(ks[1], (1, t, hkv, d), jnp.bfloat16)
  v = jax.random.normal(ks[2], (1, t, hkv, d), jnp.bfloat16)
  do = jax.random.normal(ks[3], (1, t, hq, d), jnp.bfloat16)
  seg = jnp.ones((1, t), jnp.int32)
  bs = MobaBlockSizes()
  flat = lambda x: x.reshape(1, t * hq, *x.shape[3:])
  # Row statistics at their typical size (the kernels' time does not depend on them).
  lse = jnp.full((1, t * hq), math.log(1280.0), jnp.float32)
  delta = 0.1 * jax.random.normal(ks[4], (1, t * hq), jnp.float32)
  rows = []
  for k_max in a.ks:
    sel, layout = jax.jit(lambda q, k: attention.gate_and_layout(
        q, k, seg, jnp.array([k_max]), block_size=blk, k_max=k_max, bs=bs, interpret=False,
        backend="mosaic"))(q, k)
    def item_fields(lay):
      ids, num, blocks, steps, _ = hopper.persistent_items(lay, seg, block_size=blk,
                                                           block_kv=hopper.DKV_TILE)
      return ids, num, blocks, steps.max(-1)  # an item's key steps: its longer half's

    items = jax.jit(item_fields)(layout)
    _, g, l = layout.row_src_BGL.shape
    ds = jax.random.normal(ks[4], (1, g, blk, l), jnp.bfloat16)
    q_rows = hopper.gather_rows(flat(q), layout, False)
    common = dict(block_size=blk, bs=bs, interpret=False)
    # (function, its array arguments): jitted on arguments, not closures (no constants).
    variants = {
        "dq today (+ dO rows)": (jax.jit(lambda do, lay, k, v, qr: hopper.moba_dq_rows(
            None, do, lse, delta, lay, k, v, seg, q_rows=qr, sorted_do=True, **common)),
            (flat(do), layout, k, v, q_rows)),
        "dO rows gathered": (jax.jit(lambda do, lay: hopper.gather_rows(do, lay, False)),
                             (flat(do), layout)),
        # q's sorted rows stand in for dO's (the kernels' time does not depend on values).
        "dk/dv today": (jax.jit(lambda lay, k, v, qr: hopper.moba_dkv(
            None, None, lse, delta, lay, k, v, seg, q_rows=qr, do_rows=qr, **common)),
            (layout, k, v, q_rows)),
    }
    for w in a.warps:
      for s in a.stages:
        variants[f"dq from dS (w{w} s{s})"] = (jax.jit(
            lambda ds, k, items, w=w, s=s: dq_from_ds(
                ds, k, *items, block_size=blk, item_rows=hopper.ITEM_ROWS, tile=hopper.DKV_TILE,
                interpret=False, num_warps=w, num_stages=s)), (ds, k, items))
    for name, (fn, args) in variants.items():
      rows.append(dict(k=k_max, part=name,
                       pipelined_ms=1e3 * time_pipelined(fn, *args, calls=20, repeats=3),
                       sync_ms=1e3 * time_call(fn, *args, warmup=1, repeats=10),
                       ds_gb=ds.size * 2 / 1e9))
      print(json.dumps(rows[-1]), flush=True)
  if a.out:
    with open(a.out, "w") as f:
      json.dump(rows, f)
  print(f"\nS={t}, {a.heads}, block {blk}; ms per call")
  print("| k | part | back to back | synchronised | dS GB |")
  print("|---|---|---:|---:|---:|")
  for r in rows:
    print(f"| {r['k']} | {r['part']} | {r['pipelined_ms']:.3f} | {r['sync_ms']:.3f} | "
          f"{r['ds_gb']:.2f} |")


if __name__ == "__main__":
  main()
