"""MoBA kernel benchmark on one GPU: correctness vs the reference, then timings.

Runs, in order: (1) a correctness check of the compiled kernels (values and
gradients, f32 and bf16, packed rows, GQA) against `moba_reference`; (2) cuDNN
dense causal attention; (3) MoBA forward and forward+backward for each
(S, block, k, heads) asked for, with k_max = k (the budget bucket), forward+backward
timed three ways (synchronised wall clock, the project's rule; back to back; and the
synchronised calls' span on the GPU's own clock, without the host's work around each call),
every ratio to cuDNN taken between the same two readings; (4) a budget
sweep at fixed k_max whose times are fitted against k (R^2), with the gating +
layout step timed on its own. Prints a short table last and writes every row as
JSON to --out.

Useful FLOPs (DESIGN.md): 4 * D * attended (query, key) pairs for the forward,
2.5x that for the backward; cuDNN dense causal counts T(T+1)/2 pairs per head.

    PYTHONUNBUFFERED=1 python experiments/bench_kernel.py --seqs 32768 --blocks 512 \
        --ks 2 3 4 8 16 --heads h128 --out $OUT/bench.json

Imports jax, numpy and the project's kernels, timing and result-file modules: nothing the GPU
image lacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pallas_kernels.moba import (MobaBlockSizes, build_kv_layout, moba_attention,  # noqa: E402
                                 moba_gate, moba_reference)
from pallas_kernels.moba import attention, gating, hopper, kernels  # noqa: E402
from pallas_kernels.moba.reference import reference_gate_scores  # noqa: E402
from sparsebalance_jax.balance.timing import (clocked_call, time_call,  # noqa: E402
                                              time_on_device, time_pipelined)
from sparsebalance_jax.jsonfile import write_json  # noqa: E402

HEADS = {"h128": (16, 16, 128), "h64": (14, 2, 64), "tiny": (2, 1, 16)}  # (Hq, Hkv, D)
INTERPRET = False  # --interpret: CPU smoke runs of this script


def timeit(fn, *args, reps: int) -> float:
  """Median milliseconds of fn(*args) after one warm-up (the project's timing rule)."""
  return 1e3 * time_call(fn, *args, warmup=1, repeats=reps)


def timeit_pipelined(fn, *args) -> float:
  """Milliseconds per call of back-to-back calls, one wait at the end (time_pipelined): the
  rate a training loop that does not wait per step sees, without the per-call dispatch and
  synchronisation that timeit's rule includes. Reported beside timeit's, never instead."""
  return 1e3 * time_pipelined(fn, *args, calls=1 if INTERPRET else 20, repeats=3)


def device_span(clocked, *args, reps: int) -> float:
  """Median milliseconds of a clocked_call(fn)'s calls on the GPU's own clock, synchronised as
  timeit's (time_on_device): each call's span on the GPU without the host's work around it.
  Reported beside timeit's, never instead; NaN in interpret mode (no GPU clock)."""
  if INTERPRET:
    return float("nan")
  return 1e3 * time_on_device(clocked, *args, warmup=1, repeats=reps)[1]


def inputs(seed, b, t, hq, hkv, d, dtype):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(ks[0], (b, t, hq, d), dtype)
  k = jax.random.normal(ks[1], (b, t, hkv, d), dtype)
  v = jax.random.normal(ks[2], (b, t, hkv, d), dtype)
  do = jax.random.normal(ks[3], (b, t, hq, d), dtype)
  return q, k, v, do


def fwd_bwd(fn):
  def loss(q, k, v, do):
    return jnp.sum(fn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def check_correctness(bs: MobaBlockSizes, backends) -> list[dict]:
  rows = []
  cases = [(dtype, heads, fk) for dtype, heads in ((jnp.float32, (4, 4)), (jnp.bfloat16, (14, 2)))
           for fk in backends if fk == "triton" or dtype == jnp.bfloat16]
  for dtype, (hq, hkv), fk in cases:
    b, t, block, k_max, d = 2, 2048, 256, 4, 64
    q, k, v, do = inputs(1, b, t, hq, hkv, d, dtype)
    seg = np.ones((b, t), np.int32)
    seg[0, 700:1024] = 0
    seg[0, 1024:] = 2
    seg = jnp.asarray(seg)
    budget = jnp.asarray([2, 4], jnp.int32)
    kern = lambda q, k, v: moba_attention(q, k, v, seg, budget, block_size=block, k_max=k_max,
                                          block_sizes=bs, backend=fk, interpret=INTERPRET)
    ref = lambda q, k, v: moba_reference(q, k, v, seg, budget, block_size=block, k_max=k_max)
    # Share of (token, group) whose selection differs between the gate and the
    # dense per-(block, document) definition (near ties only; 0 expected).
    sel = moba_gate(q, k, seg, budget, block_size=block, k_max=k_max)
    sel_def = gating.select_blocks(reference_gate_scores(q, k, seg, block_size=block), seg, budget,
                                   block_size=block, k_max=k_max)
    flips = float(np.mean(np.any(np.asarray(sel.selected_BTGK) != np.asarray(
        sel_def.selected_BTGK), axis=-1)))
    rows.append(dict(kind="gate_check", dtype=jnp.dtype(dtype).name, selection_mismatch=flips))
    print(f"gate {jnp.dtype(dtype).name}: selection differs from the definition at {flips:.2e} "
          "of (token, group)", flush=True)
    got = [jax.jit(kern)(q, k, v), *fwd_bwd(kern)(q, k, v, do)]
    want = [jax.jit(ref)(q, k, v), *fwd_bwd(ref)(q, k, v, do)]
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
      g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
      err = float(np.linalg.norm(g - w) / np.linalg.norm(w)) if np.all(np.isfinite(g)) else 1e9
      rows.append(dict(kind="check", dtype=jnp.dtype(dtype).name, heads=f"{hq}/{hkv}",
                       backend=fk, tensor=name, rel_err=err))
      print(f"check {jnp.dtype(dtype).name:8s} {hq}/{hkv} backend={fk} {name}: rel err {err:.2e}",
            flush=True)
  return rows


def attended_pairs(sel, block: int, group: int) -> int:
  """Pairs single-document, padding-free rows attend to (per query head), summed over the
  rows."""
  count_BTG = np.asarray(sel.count_BTG, np.int64)  # int64: the sum overflows int32
  own_T = np.arange(count_BTG.shape[1]) % block + 1
  return int(np.sum((count_BTG - 1) * block + own_T[None, :, None])) * group


def dense_causal(interpret: bool):
  """The reference every MoBA time is set beside: dense causal attention (q, k, v) -> out by
  cuDNN (XLA's own on the CPU, for interpret-mode smoke runs)."""
  impl = "xla" if interpret else "cudnn"
  return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation=impl,
                                                      is_causal=True)


def bench_cudnn(t, hq, hkv, d, reps, batch=1):
  q, k, v, do = inputs(0, batch, t, hq, hkv, d, jnp.bfloat16)
  f = dense_causal(INTERPRET)
  fwd_ms = timeit(jax.jit(f), q, k, v, reps=reps)
  fb_ms = timeit(fwd_bwd(f), q, k, v, do, reps=reps)
  fb_pipe_ms = timeit_pipelined(fwd_bwd(f), q, k, v, do)
  fb_span_ms = device_span(clocked_call(fwd_bwd(f)), q, k, v, do, reps=reps)
  flops = 4 * d * hq * t * (t + 1) / 2 * batch
  return dict(kind="cudnn", seq=t, batch=batch, heads=f"{hq}/{hkv}", d=d, fwd_ms=fwd_ms,
              fwdbwd_ms=fb_ms, fwdbwd_pipe_ms=fb_pipe_ms,
              fwdbwd_pipe_tflops=3.5 * flops / fb_pipe_ms / 1e9,
              fwdbwd_span_ms=fb_span_ms, fwdbwd_span_tflops=3.5 * flops / fb_span_ms / 1e9,
              fwd_tflops=flops / fwd_ms / 1e9, fwdbwd_tflops=3.5 * flops / fb_ms / 1e9)


def bench_moba(t, block, ks, k_max, hq, hkv, d, bs, reps, kind="moba", gate=True,
               backend="triton", batch=1):
  """One compile per (shape, k_max); every budget in ks reuses it (budgets are data). batch
  rows of t tokens, each one document, every row at the same budget."""
  q, k_, v, do = inputs(0, batch, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((batch, t), jnp.int32)
  f = lambda q, k_, v, budget: moba_attention(q, k_, v, seg, budget, block_size=block,
                                              k_max=k_max, block_sizes=bs,
                                              backend=backend, interpret=INTERPRET)
  fwd = jax.jit(f)
  fb = jax.jit(jax.grad(lambda q, k_, v, do, budget: jnp.sum(
      f(q, k_, v, budget).astype(jnp.float32) * do.astype(jnp.float32)), argnums=(0, 1, 2)))
  fb_clocked = clocked_call(fb)  # compiled once, as fb: budgets are data
  sel_fn = jax.jit(lambda q, k_, budget: moba_gate(q, k_, seg, budget, block_size=block,
                                                   k_max=k_max))
  gate_fn = jax.jit(lambda q, k_, budget: step_gating(
      q, k_, seg, budget, block_size=block, k_max=k_max, bs=bs, interpret=INTERPRET,
      backend=backend))
  rows = []
  for k in ks:
    budget = jnp.full((batch,), k, jnp.int32)
    flops = 4 * d * attended_pairs(sel_fn(q, k_, budget), block, hq // hkv)
    row = dict(kind=kind, seq=t, batch=batch, block=block, k=k, k_max=k_max,
               heads=f"{hq}/{hkv}", d=d, backend=backend,
               block_sizes=dataclasses.asdict(bs.fit(block, d)))
    row["fwd_ms"] = timeit(fwd, q, k_, v, budget, reps=reps)
    row["fwdbwd_ms"] = timeit(fb, q, k_, v, do, budget, reps=reps)
    row["fwd_tflops"] = flops / row["fwd_ms"] / 1e9
    row["fwdbwd_tflops"] = 3.5 * flops / row["fwdbwd_ms"] / 1e9
    row["fwdbwd_pipe_ms"] = timeit_pipelined(fb, q, k_, v, do, budget)
    row["fwdbwd_pipe_tflops"] = 3.5 * flops / row["fwdbwd_pipe_ms"] / 1e9
    row["fwdbwd_span_ms"] = device_span(fb_clocked, q, k_, v, do, budget, reps=reps)
    row["fwdbwd_span_tflops"] = 3.5 * flops / row["fwdbwd_span_ms"] / 1e9
    if gate:
      row["gate_ms"] = timeit(gate_fn, q, k_, budget, reps=reps)
    row["compiles_fwdbwd"] = fb._cache_size()
    row["compiles_clocked"] = fb_clocked._cache_size()
    rows.append(row)
    print(row, flush=True)
  return rows


def variant_tag(bs: MobaBlockSizes) -> str:
  """Short name of a block-size variant, as in the --variants syntax."""
  bwd = (f"_bw{bs.num_warps_bwd}_bs{bs.num_stages_bwd}"
         if (bs.num_warps_bwd, bs.num_stages_bwd) != (bs.num_warps, bs.num_stages) else "")
  return (f"r{bs.block_rows}_k{bs.block_k}_kd{bs.block_k_dkv}_w{bs.num_warps}_s{bs.num_stages}"
          f"{bwd}{'_skipfull' if bs.skip_full_masks else ''}{'' if bs.fast_exp2 else '_libexp2'}")


def profile_stages(t, block, k, hq, hkv, d, variants, reps, batch=1):
  """Times each stage alone (gating parts, row gathers, each kernel) per block-size variant."""
  q, k_, v, do = inputs(0, batch, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((batch, t), jnp.int32)
  budget = jnp.full((batch,), k, jnp.int32)
  n, gh = t // block, hq // hkv
  row = dict(kind="profile", seq=t, batch=batch, block=block, k=k, heads=f"{hq}/{hkv}", d=d)
  scores = jax.jit(lambda q, k_: gating.gate_scores(q, k_, seg, block_size=block))
  row["gate_scores_ms"] = timeit(scores, q, k_, reps=reps)
  sc = scores(q, k_)
  select = jax.jit(lambda sc, b: gating.select_blocks(sc, seg, b, block_size=block, k_max=k))
  row["select_ms"] = timeit(select, sc, budget, reps=reps)
  sel = select(sc, budget)
  fused = jax.jit(lambda q, k_, b: gating.fused_gate(q, k_, seg, b, block_size=block,
                                                      k_max=k, interpret=INTERPRET))
  row["fused_gate_ms"] = timeit(fused, q, k_, budget, reps=reps)
  for bs in (v.fit(block, d) for v in variants):
    tag = variant_tag(bs)
    lay_fn = jax.jit(lambda sel: build_kv_layout(
        sel, seg, num_blocks=n, group_size=gh, block_rows=bs.block_rows,
        mark_full=bs.skip_full_masks, tile_ranks=attention.layout_tile_ranks(t, k),
        interpret=INTERPRET))
    row[f"layout_ms_{tag}"] = timeit(lay_fn, sel, reps=reps)
    lay = lay_fn(sel)
    q_flat, do_flat = q.reshape(batch, t * hq, d), do.reshape(batch, t * hq, d)
    fwd = jax.jit(lambda q_flat, k_, v: kernels.moba_forward_rows(
        q_flat, lay, k_, v, seg, block_size=block, bs=bs, interpret=INTERPRET))
    row[f"fwd_kernel_ms_{tag}"] = timeit(fwd, q_flat, k_, v, reps=reps)
    try:  # the Hopper forward (its q row gather included), where the variant fits it
      lay_h = build_kv_layout(sel, seg, num_blocks=n, group_size=gh, block_rows=bs.block_rows,
                              mark_full=bs.skip_full_masks, pad_rows=hopper.ITEM_ROWS)
      fwd_h = jax.jit(lambda q_flat, k_, v: hopper.moba_forward_rows(
          q_flat, lay_h, k_, v, seg, block_size=block, bs=bs, interpret=INTERPRET))
      row[f"fwd_mosaic_kernel_ms_{tag}"] = timeit(fwd_h, q_flat, k_, v, reps=reps)
    except ValueError as e:
      print(f"mosaic forward skipped for {tag}: {e}", flush=True)
    lse_flat = jnp.full((batch, t * hq), 5.0, jnp.float32)
    args = (q_flat, do_flat, lse_flat, lse_flat * 0.01, lay, k_, v, seg)
    dq = jax.jit(lambda *a: kernels.moba_dq_rows(*a, block_size=block, bs=bs,
                                                 interpret=INTERPRET))
    row[f"dq_kernel_ms_{tag}"] = timeit(dq, *args, reps=reps)
    dkv = jax.jit(lambda *a: kernels.moba_dkv(*a, block_size=block, bs=bs, interpret=INTERPRET))
    row[f"dkv_kernel_ms_{tag}"] = timeit(dkv, *args, reps=reps)
    print({kk: round(vv, 3) for kk, vv in row.items() if tag in kk}, flush=True)
  return row


def parse_variant(text: str) -> MobaBlockSizes:
  """'rows,k,kdkv,warps,stages[,skip_full_masks[,warps_bwd,stages_bwd[,fast_exp2]]]' ->
  MobaBlockSizes (skip_full_masks 0, 1 or a = by head_dim, the default; the backward takes the
  forward's warps and stages unless given; fast_exp2 0 or 1, default 1)."""
  fields = text.split(",")
  if len(fields) not in (5, 6, 8, 9):
    raise ValueError(f"variant {text!r}: need rows,k,kdkv,warps,stages"
                     "[,skip_full_masks[,warps_bwd,stages_bwd[,fast_exp2]]]")
  skip = fields[5] if len(fields) >= 6 else "a"
  if skip not in ("0", "1", "a"):
    raise ValueError(f"variant {text!r}: skip_full_masks must be 0, 1 or a, got {skip!r}")
  fast = fields[8] if len(fields) == 9 else "1"
  if fast not in ("0", "1"):
    raise ValueError(f"variant {text!r}: fast_exp2 must be 0 or 1, got {fast!r}")
  try:
    r, kk, kd, w, s, *bwd = (int(x) for i, x in enumerate(fields[:8]) if i != 5)
  except ValueError:
    raise ValueError(f"variant {text!r}: every field but skip_full_masks is an integer") from None
  wb, sb = bwd or (w, s)
  return MobaBlockSizes(block_rows=r, block_k=kk, block_k_dkv=kd, num_warps=w, num_stages=s,
                        num_warps_bwd=wb, num_stages_bwd=sb,
                        skip_full_masks=None if skip == "a" else skip == "1",
                        fast_exp2=fast == "1")


def add_point_args(p: argparse.ArgumentParser) -> None:
  """--seq, --block, --k, --heads, --batch: the one attention shape the single-point scripts
  (ncu_moba, trace_moba, triton_ir, persistent_forward) run; defaults are the issue's
  headline point."""
  p.add_argument("--seq", type=int, default=32768)
  p.add_argument("--batch", type=int, default=1,
                 help="rows of --seq tokens, each one document, all at budget --k")
  p.add_argument("--block", type=int, default=512)
  p.add_argument("--k", type=int, default=3)
  p.add_argument("--heads", default="h128", choices=list(HEADS))


# What a record of add_point_args' point holds, and what a record made before a field existed
# reads as (records before --batch timed one row).
POINT_KEYS = ("seq", "batch", "block", "k", "heads")
_POINT_DEFAULTS = {"batch": 1}


def point_fields(args: argparse.Namespace) -> dict:
  """add_point_args' point as the fields a result JSON records."""
  return {key: getattr(args, key) for key in POINT_KEYS}


def recorded_point(record: dict, key: str):
  """A point field of a result JSON's record, as point_fields wrote it (or an earlier record
  without the field reads)."""
  return record.get(key, _POINT_DEFAULTS.get(key))


def point_inputs(args: argparse.Namespace):
  """The add_point_args shape's head_dim and bf16 inputs: (d, q, k, v, do, seg, budget),
  args.batch rows of one document each, budget args.k (seed 0, as every bench_kernel row)."""
  hq, hkv, d = HEADS[args.heads]
  b = args.batch
  if b < 1:
    raise ValueError(f"--batch must be at least 1, got {b}")
  q, k, v, do = inputs(0, b, args.seq, hq, hkv, d, jnp.bfloat16)
  return (d, q, k, v, do, jnp.ones((b, args.seq), jnp.int32),
          jnp.full((b,), args.k, jnp.int32))


class KernelPoint(NamedTuple):
  """The add_point_args shape's operands for calling the row kernels directly."""
  d: int
  k: jax.Array
  v: jax.Array
  seg: jax.Array
  layout: Any     # layout(pad_rows): the KV layout (64-row chunks, runs padded to pad_rows)
  q_flat: jax.Array  # q as [B, T * Hq, D]
  do_flat: jax.Array
  lse: jax.Array
  delta: jax.Array


def kernel_point(args: argparse.Namespace) -> KernelPoint:
  """point_inputs with the gate's selection, its KV layout and a backward's other operands:
  dO, lse and delta are random (seed 1) - any finite values define the same function in
  both kernel sets, so their outputs compare."""
  hq, hkv, _ = HEADS[args.heads]
  t, block = args.seq, args.block
  d, q, k, v, _, seg, budget = point_inputs(args)
  sel = jax.jit(lambda q, k: gating.fused_gate(q, k, seg, budget, block_size=block,
                                                k_max=args.k, interpret=False))(q, k)
  layout = lambda pad: build_kv_layout(sel, seg, num_blocks=t // block, group_size=hq // hkv,
                                       block_rows=64, mark_full=False, pad_rows=pad)
  q_flat = q.reshape(q.shape[0], t * hq, d)
  rng = np.random.default_rng(1)
  do_flat = jnp.asarray(rng.standard_normal(q_flat.shape), q_flat.dtype)
  lse = jnp.asarray(rng.uniform(6.0, 9.0, size=q_flat.shape[:2]), jnp.float32)
  delta = jnp.asarray(rng.standard_normal(q_flat.shape[:2]), jnp.float32)
  return KernelPoint(d, k, v, seg, layout, q_flat, do_flat, lse, delta)


def step_gating(q, k, seg, budget, **kwargs):
  """The gating moba_attention runs (attention.gate_and_layout with kwargs), returning only
  what the step reads of it - the selected blocks and the layout: returning the whole
  selection would also materialise its per-token counts, which the step never computes
  (0.42 against 0.30 ms of GPU time at the headline point)."""
  sel, layout = attention.gate_and_layout(q, k, seg, budget, **kwargs)
  return sel.selected_BTGK, layout


def with_ratios(row, cudnn_row):
  """row with its useful-FLOP rates over cuDNN's, each clock against the same clock (ratio_fwd,
  ratio_fwdbwd: synchronised; _pipe: back to back; _span: the GPU's clock), set as the row is
  made, so that the JSON written after it holds them even if the run is cut short."""
  for key in ("fwd", "fwdbwd", "fwdbwd_pipe", "fwdbwd_span"):
    row[f"ratio_{key}"] = row[f"{key}_tflops"] / cudnn_row[f"{key}_tflops"]
  return row


def r_squared(x, y):
  x, y = np.asarray(x, float), np.asarray(y, float)
  a, b = np.polyfit(x, y, 1)
  res = y - (a * x + b)
  return float(1 - np.sum(res ** 2) / np.sum((y - y.mean()) ** 2))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seqs", type=int, nargs="+", default=[32768])
  p.add_argument("--blocks", type=int, nargs="+", default=[512, 256])
  p.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 8, 16, 32])
  p.add_argument("--heads", nargs="+", default=["h128", "h64"], choices=list(HEADS))
  p.add_argument("--sweep", type=int, default=0,
                 help="k_max of the budget sweep (k = 2..k_max, one compile); 0 = none")
  p.add_argument("--variants", default="",
                 help="extra MobaBlockSizes for the first config: "
                      "'rows,k,kdkv,warps,stages[,skip_full_masks 0/1/a"
                      "[,warps_bwd,stages_bwd]];...'")
  p.add_argument("--variants-everywhere", action="store_true",
                 help="time the variants at every (S, block, k, heads), not only the first")
  p.add_argument("--profile", action="store_true",
                 help="time each stage alone at the first (S, block, k, heads) for every variant")
  p.add_argument("--backends", nargs="+", default=["triton"],
                 choices=sorted(attention.BACKENDS),
                 help="kernel sets to check and time (forward, dq, dk/dv)")
  p.add_argument("--batch", type=int, default=1,
                 help="rows per call (each --seqs tokens, one document, every row at budget k); "
                      "cuDNN runs the same batch")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--skip-check", action="store_true")
  p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU smoke)")
  p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_kernel.json"))
  args = p.parse_args()
  if args.batch < 1:
    p.error(f"--batch must be at least 1, got {args.batch}")
  global INTERPRET
  INTERPRET = args.interpret
  print("device:", jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
  bs0 = MobaBlockSizes()  # skip_full_masks by head_dim (variant_tag shows the choice)
  rows = [] if args.skip_check else check_correctness(bs0, args.backends)
  variants = [bs0] + [parse_variant(v) for v in args.variants.split(";") if v]
  if args.profile:
    hq, hkv, d = HEADS[args.heads[0]]
    rows.append(profile_stages(args.seqs[0], args.blocks[0], args.ks[0], hq, hkv, d, variants,
                               args.reps, args.batch))
    print(rows[-1], flush=True)

  def save():  # Whole or not at all: a command cut at its time limit keeps the rows before.
    write_json(args.out, dict(device=jax.devices()[0].device_kind, rows=rows), indent=1)

  # What one synchronised call costs with no work in it (dispatch, launch, the wait for the
  # result): every time below carries it once.
  one = jnp.zeros((1,), jnp.float32)
  rows.append(dict(kind="floor", ms=timeit(jax.jit(lambda x: x + 1), one, reps=args.reps)))
  for name in args.heads:
    hq, hkv, d = HEADS[name]
    for t in args.seqs:
      rows.append(bench_cudnn(t, hq, hkv, d, args.reps, args.batch))
      cudnn_row = rows[-1]
      print(cudnn_row, flush=True)
      save()
      for block in args.blocks:
        for k in args.ks:
          if k > t // block:
            continue
          first = t == args.seqs[0] and block == args.blocks[0] and k == args.ks[0]
          timed = variants if args.variants_everywhere or (first and not args.profile) else [bs0]
          for bs, fk in itertools.product(timed, args.backends):
            try:
              rows.extend(with_ratios(r, cudnn_row) for r in bench_moba(
                  t, block, [k], k, hq, hkv, d, bs, args.reps, backend=fk, batch=args.batch))
            except Exception as e:  # a variant that fails to compile is reported, not fatal
              rows.append(dict(kind="moba_error", seq=t, batch=args.batch, block=block, k=k,
                               heads=name, backend=fk, block_sizes=dataclasses.asdict(bs),
                               error=str(e)[:300]))
              print(rows[-1], flush=True)
            save()
        if args.sweep and args.sweep <= t // block:
          for fk in args.backends:
            rows.extend(with_ratios(r, cudnn_row) for r in bench_moba(
                t, block, range(2, args.sweep + 1), args.sweep, hq, hkv, d, bs0, args.reps,
                kind="sweep", gate=False, backend=fk, batch=args.batch))
            save()
  # Short table last.
  cud = [r for r in rows if r["kind"] == "cudnn"]
  print(f"\nbatch {args.batch} (rows per call, each one document)")
  print("kind  backend           heads  S      block k  kmax  fwd_ms  fb_ms   fwdTF  fbTF   "
        "xcuDNN(fb) gate_ms  fb_pipe xcuDNN(pipe)  fb_gpu xcuDNN(gpu)  tiles")
  for r in rows:
    if r["kind"] not in ("moba", "sweep"):
      continue
    r.setdefault("gate_ms", float("nan"))
    print(f"{r['kind']:5s} {r['backend']:17s} {r['heads']:6s} {r['seq']:6d} "
          f"{r['block']:5d} {r['k']:2d} {r['k_max']:4d} {r['fwd_ms']:7.3f} {r['fwdbwd_ms']:7.3f} "
          f"{r['fwd_tflops']:6.1f} {r['fwdbwd_tflops']:6.1f} {r['ratio_fwdbwd']:6.3f} "
          f"{r['gate_ms']:7.3f}  {r['fwdbwd_pipe_ms']:7.3f} {r['ratio_fwdbwd_pipe']:6.3f}  "
          f"{r['fwdbwd_span_ms']:7.3f} {r['ratio_fwdbwd_span']:6.3f}  "
          f"{variant_tag(MobaBlockSizes(**r['block_sizes']))}")
  for c in cud:
    print(f"cudnn {c['heads']:6s} {c['seq']:6d} fwd {c['fwd_ms']:.3f} ms "
          f"({c['fwd_tflops']:.0f} TF/s)"
          f" fwd+bwd {c['fwdbwd_ms']:.3f} ms ({c['fwdbwd_tflops']:.0f} TF/s); back to back "
          f"{c['fwdbwd_pipe_ms']:.3f} ms ({c['fwdbwd_pipe_tflops']:.0f} TF/s); on the GPU's clock "
          f"{c['fwdbwd_span_ms']:.3f} ms ({c['fwdbwd_span_tflops']:.0f} TF/s)")
  for r in rows:
    if r["kind"] == "floor":
      print(f"floor: one synchronised call of a jitted x + 1 takes {r['ms']:.3f} ms")
  sweeps = {}
  for r in rows:
    if r["kind"] == "sweep":
      sweeps.setdefault((r["backend"], r["heads"], r["seq"], r["block"], r["k_max"]),
                        []).append(r)
  for key, rs in sweeps.items():
    ks = [r["k"] for r in rs]
    fit = dict(kind="fit", key=list(key), r2_fwd=r_squared(ks, [r["fwd_ms"] for r in rs]),
               r2_fwdbwd=r_squared(ks, [r["fwdbwd_ms"] for r in rs]))
    rows.append(fit)
    print(f"R^2 time vs k {key}: fwd {fit['r2_fwd']:.4f} fwd+bwd {fit['r2_fwdbwd']:.4f}")
  save()
  # The tests' bounds (tests/test_moba_kernel.py TOL): float32 runs its dots in IEEE float32.
  bad = [r for r in rows if r["kind"] == "check" and r["rel_err"] > (
      1e-5 if r["dtype"] == "float32" else 2e-2)]
  if bad:
    print("CORRECTNESS FAILED:", bad)
    sys.exit(1)


if __name__ == "__main__":
  main()
