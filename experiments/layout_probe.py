"""Ways to compute the KV layout's ranks (each (token, slot)'s place in its block's run, and
each block's reader count) and dk/dv's item order, timed alone on a real gate's selection:
which formulation (XLA's, or kv_layout.tile_read_ranks' kernel at several tiles and warps) the
GPU runs fastest. Every variant's output is checked equal to kv_layout._read_ranks' first.
GPU (or, slowly, CPU at a small size: the kernel in interpret mode).

    python -m experiments.layout_probe --ks 3 8 16 --out /tmp/layout_probe.json
"""

import argparse
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.moba import hopper, kv_layout, moba_gate
from sparsebalance_jax.balance.timing import time_pipelined


def ranks_running_count(sel_BGTK, n, chunk=128):
  """A [B, G, T, N] running count by a lower-triangular 0/1 product per chunk of tokens, read
  at each slot's block."""
  b, g, t, _ = sel_BGTK.shape
  p = math.gcd(t, chunk)
  reads_BGCPN = (sel_BGTK[..., None] == jnp.arange(n, dtype=jnp.int32)).any(axis=3).astype(
      jnp.bfloat16).reshape(b, g, t // p, p, n)
  tri_PQ = (jnp.arange(p)[:, None] >= jnp.arange(p)[None, :]).astype(jnp.bfloat16)
  within_BGCPN = jnp.einsum("pq,bgcqn->bgcpn", tri_PQ, reads_BGCPN,
                            preferred_element_type=jnp.float32).astype(jnp.int32)
  totals_BGCN = within_BGCPN[:, :, :, -1]
  before_BGCN = jnp.cumsum(totals_BGCN, axis=2) - totals_BGCN
  csum_BGTN = (within_BGCPN + before_BGCN[:, :, :, None]).reshape(b, g, t, n)
  rank_BGTK = jnp.take_along_axis(csum_BGTN, jnp.minimum(sel_BGTK, n - 1), axis=3) - 1
  return rank_BGTK, csum_BGTN[:, :, -1]


def ranks_slot_onehot(sel_BGTK, n, chunk=128):
  """_read_ranks with the running count's product over (token, slot) pairs of a one-hot of
  each slot's block (a compare XLA may fuse into the product's operand) instead of over
  tokens of a per-token any-of-slots bitmap."""
  b, g, t, k = sel_BGTK.shape
  p = math.gcd(t, chunk)
  c = t // p
  onehot_BGCQKN = (sel_BGTK.reshape(b, g, c, p, k)[..., None]
                   == jnp.arange(n, dtype=jnp.int32)).astype(jnp.bfloat16)
  tri_PQ = (jnp.arange(p)[:, None] >= jnp.arange(p)[None, :]).astype(jnp.bfloat16)
  within_BGCPN = jnp.einsum("pq,bgcqkn->bgcpn", tri_PQ, onehot_BGCQKN,
                            preferred_element_type=jnp.bfloat16)
  return kv_layout.ranks_from_counts(within_BGCPN, sel_BGTK)


def ranks_sorted(sel_BGTK, n, *, batched=False, key_dtype=jnp.int32):
  """Ranks by one stable sort of the (token, slot) entries by block: an entry's rank is its
  place in the sorted order less its block's first place (each block's first place found by
  a binary search of the sorted keys). Work in T * K, not T * N. batched: one sort per (row,
  group) along the entries (a batched sort) instead of one sort of every (row, group)'s
  entries with the (row, group) folded into the key; key_dtype: the sort key's type."""
  b, g, t, k = sel_BGTK.shape
  m = t * k
  keys_XM = sel_BGTK.reshape(b * g, m)  # 0..n, n on unused slots
  if not batched:
    keys_XM = keys_XM + (n + 1) * jnp.arange(b * g, dtype=jnp.int32)[:, None]
  keys = keys_XM.astype(key_dtype)
  if batched:
    iota = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), keys.shape)
    skey, perm = jax.lax.sort((keys, iota), dimension=1, num_keys=1, is_stable=True)
    bounds = jnp.arange(n + 2, dtype=key_dtype)
    first_XN = jax.vmap(lambda row: jnp.searchsorted(row, bounds).astype(jnp.int32))(skey)
    place = jnp.arange(m, dtype=jnp.int32)
    rank_sorted = place - jnp.take_along_axis(first_XN, skey.astype(jnp.int32), axis=1)
    rank_XM = jnp.zeros((b * g, m), jnp.int32).at[
        jnp.arange(b * g)[:, None], perm].set(rank_sorted, unique_indices=True)
    total = (first_XN[:, 1:n + 1] - first_XN[:, :n]).reshape(b, g, n)
  else:
    flat = keys.reshape(-1)
    iota = jnp.arange(flat.size, dtype=jnp.int32)
    skey, perm = jax.lax.sort((flat, iota), num_keys=1, is_stable=True)
    bounds = jnp.arange(b * g * (n + 1) + 1, dtype=key_dtype)
    first = jnp.searchsorted(skey, bounds).astype(jnp.int32)
    rank_sorted = iota - first[skey.astype(jnp.int32)]
    rank_XM = jnp.zeros((flat.size,), jnp.int32).at[perm].set(rank_sorted, unique_indices=True)
    total = (jnp.diff(first).reshape(b * g, n + 1)[:, :n]).reshape(b, g, n)
  return rank_XM.reshape(b, g, t, k), total


def _chunk(t, k, compares):
  return math.gcd(t, max(1, 1 << ((compares // k).bit_length() - 1)))


def reads_compare(sel_BGCX, n):
  """[B, G, C, N]: reads of each block per chunk, a sum of compares over the chunk's slots."""
  return (sel_BGCX[..., None] == jnp.arange(n, dtype=jnp.int32)).sum(axis=3, dtype=jnp.int32)


def reads_minor(sel_BGCX, n):
  """The same with the summed axis minor (a row reduction)."""
  return (jnp.arange(n, dtype=jnp.int32)[:, None] == sel_BGCX[..., None, :]).sum(
      axis=-1, dtype=jnp.int32)


def reads_scatter(sel_BGCX, n):
  """The same by a scatter-add of ones (the sentinel n into a column dropped after)."""
  b, g, c, x = sel_BGCX.shape
  idx = (jnp.arange(b)[:, None, None, None], jnp.arange(g)[None, :, None, None],
         jnp.arange(c)[None, None, :, None], sel_BGCX)
  return jnp.zeros((b, g, c, n + 1), jnp.int32).at[idx].add(1)[..., :n]


def within_compare(sel_BGCPK):
  """[B, G, C, P, K]: earlier tokens of the chunk reading the slot's block."""
  p = sel_BGCPK.shape[3]
  earlier_PQ = jnp.arange(p)[:, None] > jnp.arange(p)[None, :]
  same = sel_BGCPK[:, :, :, :, :, None, None] == sel_BGCPK[:, :, :, None, None, :, :]
  return (same & earlier_PQ[:, None, :, None]).sum(axis=(5, 6), dtype=jnp.int32)


def ranks_chunked(sel_BGTK, n, *, reads, compares, reads_chunk=None):
  """Ranks from per-chunk reads (an exclusive cumsum over chunks) plus the rank inside the
  chunk; reads_chunk: count reads per chunk of that many tokens (a multiple of the compare
  chunk) instead."""
  b, g, t, k = sel_BGTK.shape
  p = _chunk(t, k, compares)
  c = t // p
  sel_BGCPK = sel_BGTK.reshape(b, g, c, p, k)
  pr = p if reads_chunk is None else math.gcd(t, reads_chunk)
  reads_BGCN = reads(sel_BGTK.reshape(b, g, t // pr, pr * k), n)
  total_BGN = reads_BGCN.sum(axis=2, dtype=jnp.int32)
  before_BGCN = jnp.cumsum(reads_BGCN, axis=2, dtype=jnp.int32) - reads_BGCN
  blk_BGTK = jnp.minimum(sel_BGTK, n - 1)
  before_BGTK = jnp.take_along_axis(before_BGCN, blk_BGTK.reshape(b, g, t // pr, pr * k),
                                    axis=3).reshape(b, g, t, k)
  if pr != p:  # add the reads of the compare chunks before this one inside its reads chunk
    sub_BGCN = reads(sel_BGCPK.reshape(b, g, c, p * k), n).reshape(b, g, t // pr, pr // p, n)
    sub_before = (jnp.cumsum(sub_BGCN, axis=3, dtype=jnp.int32) - sub_BGCN).reshape(b, g, c, n)
    before_BGTK += jnp.take_along_axis(sub_before, blk_BGTK.reshape(b, g, c, p * k),
                                       axis=3).reshape(b, g, t, k)
  return before_BGTK + within_compare(sel_BGCPK).reshape(b, g, t, k), total_BGN


def _tile_kernel_ranks(sel_BTGK, n, **kwargs):
  """kv_layout.tile_read_ranks on the gate's own [B, T, G, K] selection (main passes it so)."""
  return kv_layout.tile_read_ranks(sel_BTGK, n, interpret=jax.default_backend() != "gpu",
                                   **kwargs)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seq", type=int, default=32768)
  p.add_argument("--block", type=int, default=512)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--ks", type=int, nargs="+", default=[3, 8, 16])
  p.add_argument("--calls", type=int, default=50)
  p.add_argument("--only", nargs="+", default=None,
                 help="run only the variants whose names contain one of these strings")
  p.add_argument("--no-pieces", action="store_true", help="skip the pieces and the item order")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  rng = np.random.default_rng(0)
  t, n, h = args.seq, args.seq // args.block, args.heads
  q = jnp.asarray(rng.standard_normal((1, t, h, 128)), jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((1, t, h, 128)), jnp.bfloat16)
  seg = jnp.ones((1, t), jnp.int32)
  rows = []
  for k_max in args.ks:
    sel = moba_gate(q, k, seg, jnp.asarray([k_max], jnp.int32), block_size=args.block,
                    k_max=k_max)
    sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
    used = np.asarray(sel_BGTK < n)
    want_rank, want_total = jax.jit(kv_layout._read_ranks, static_argnames="n")(sel_BGTK, n)
    variants = {"running count (tri product)": ranks_running_count,
                "_read_ranks (as committed)": kv_layout._read_ranks,
                "_read_ranks, 64-token chunks": functools.partial(kv_layout._read_ranks, chunk=64),
                "_read_ranks, 32-token chunks": functools.partial(kv_layout._read_ranks, chunk=32),
                "running count over (token, slot) one-hots": ranks_slot_onehot}
    for reads_name, reads in (("compare", reads_compare), ("minor", reads_minor),
                              ("scatter", reads_scatter)):
      for compares in (64, 128):
        for rc in (None, 128):
          name = f"reads {reads_name}, {compares} compares" + (", reads per 128" if rc else "")
          variants[name] = functools.partial(ranks_chunked, reads=reads, compares=compares,
                                             reads_chunk=rc)
    for batched in (False, True):
      for key_dtype in (jnp.int32, jnp.uint16):
        if key_dtype == jnp.uint16 and (n + 1) * sel_BGTK.shape[1] >= 1 << 16:
          continue
        name = (f"sorted, {'batched' if batched else 'one sort'}, "
                f"{jnp.dtype(key_dtype).name} keys")
        variants[name] = functools.partial(ranks_sorted, batched=batched, key_dtype=key_dtype)
    # The tile kernel (kv_layout.tile_read_ranks) reads the gate's [B, T, G, K] selection.
    for tile in (32, 64, 128):
      for warps in (2, 4, 8):
        if k_max <= kv_layout.TILE_RANK_MAX_SLOTS and tile * warps <= 512:
          variants[f"tile kernel, {tile} tokens, {warps} warps"] = functools.partial(
              _tile_kernel_ranks, block_size=args.block, tile=tile, num_warps=warps)
    if args.only:
      variants = {name: fn for name, fn in variants.items()
                  if any(part in name for part in args.only)}
    for name, fn in variants.items():
      f = jax.jit(fn, static_argnames="n")
      arg = sel.selected_BTGK if name.startswith("tile kernel") else sel_BGTK
      rank, total = f(arg, n)
      ok = bool(np.array_equal(np.asarray(rank)[used], np.asarray(want_rank)[used])
                and np.array_equal(np.asarray(total), np.asarray(want_total)))
      ms = time_pipelined(f, arg, n, calls=args.calls) * 1e3
      # Whether XLA ran a sort as CUB's radix sort (a custom call) or its own sort kernel.
      hlo = f.lower(arg, n).compile().as_text()
      sort = "cub" if "cub" in hlo.lower() else ("xla" if " sort(" in hlo else "-")
      rows.append({"k_max": k_max, "variant": name, "ms": ms, "equal": ok, "sort": sort})
      print(f"k_max {k_max:2d}  {ms:7.4f} ms  equal={ok}  sort={sort}  {name}", flush=True)
    if args.no_pieces:
      continue
    # The pieces alone (no check): each reads variant per 32-token chunk, the in-chunk rank.
    b, g, t_, kk = sel_BGTK.shape
    for name, fn in (("reads compare", reads_compare), ("reads minor", reads_minor),
                     ("reads scatter", reads_scatter)):
      for chunk in (32, 128):
        f = jax.jit(lambda s, fn=fn, chunk=chunk: fn(s.reshape(b, g, t_ // chunk, chunk * kk), n))
        ms = time_pipelined(f, sel_BGTK, calls=args.calls) * 1e3
        rows.append({"k_max": k_max, "piece": f"{name} per {chunk}", "ms": ms})
        print(f"k_max {k_max:2d}  {ms:7.4f} ms  piece: {name} per {chunk} tokens", flush=True)
    for compares in (64, 128):
      pc = _chunk(t_, kk, compares)
      f = jax.jit(lambda s, pc=pc: within_compare(s.reshape(b, g, t_ // pc, pc, kk)))
      ms = time_pipelined(f, sel_BGTK, calls=args.calls) * 1e3
      rows.append({"k_max": k_max, "piece": f"within, {compares} compares", "ms": ms})
      print(f"k_max {k_max:2d}  {ms:7.4f} ms  piece: rank in chunk, {compares} compares",
            flush=True)
  # dk/dv's item order at this shape: (T / 128) tiles per (row, group).
  items = h * t // hopper.DKV_TILE
  length = jnp.asarray(rng.integers(0, 64, items), jnp.int32)
  orders = (("argsort", lambda x: jnp.argsort(-x, stable=True).astype(jnp.int32)),
            ("longest_first", hopper.longest_first))
  for name, fn in orders if not args.no_pieces else ():
    f = jax.jit(fn)
    ok = bool(np.array_equal(f(length), np.argsort(-np.asarray(length), kind="stable")))
    ms = time_pipelined(f, length, calls=args.calls) * 1e3
    rows.append({"items": items, "variant": name, "ms": ms, "equal": ok})
    print(f"order of {items} items  {ms:7.4f} ms  equal={ok}  {name}", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"device": str(jax.devices()[0]), "seq": t, "block": args.block, "heads": h,
                 "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
