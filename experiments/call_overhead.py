"""What one synchronised call costs beyond its GPU work, by kind of kernel: a trivial XLA
computation, a minimal Pallas Mosaic GPU kernel, a minimal Pallas Triton kernel, and 1 / 3 / 6
of each in one jitted function (each kernel adds 1 to a small array - the XLA one takes the
sine first - so the GPU work is a few microseconds). Per variant: ms per call synchronised
(median of 50, the project's rule) and back to back (50 calls, one wait). GPU only.

    python -m experiments.call_overhead [--long --out $OUT/overhead.json]

--long adds programs of milliseconds (--programs picks): chains of bf16 8192^3 matrix
products (~3 and ~25 ms), the MoBA forward+backward step (Hopper kernels, S=32K, 16/16 x 128,
block 512, top-3) and cuDNN's dense causal one. Each runs between two readings of the GPU's
own clock (`device_clock.clocked`), so every synchronised call gives its wall time and its
span on the GPU; their difference is what the call costs the host before its first kernel
and after its last. Each synchronised call is waited for two ways: `jax.block_until_ready`
(the project's rule) and a spin on `Array.is_ready()` (the host thread stays awake). What a
plain matmul chain of the step's length pays too is the host's, not the step's structure.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu_mgpu
from jax.experimental.pallas import triton as plgpu_triton

from sparsebalance_jax.balance.timing import (clocked_call, device_samples, time_call,
                                              time_pipelined)


def mosaic_add_one(x, interpret=False):
  def body(x_ref, o_ref):
    def scoped(x_smem, o_smem, bar):
      plgpu_mgpu.copy_gmem_to_smem(x_ref, x_smem, bar)
      plgpu_mgpu.barrier_wait(bar)
      o_smem[...] = x_smem[...] + 1.0
      plgpu_mgpu.commit_smem()
      plgpu_mgpu.copy_smem_to_gmem(o_smem, o_ref)
      plgpu_mgpu.wait_smem_to_gmem(0)

    pl.run_scoped(scoped, plgpu_mgpu.SMEM(x.shape, x.dtype), plgpu_mgpu.SMEM(x.shape, x.dtype),
                  plgpu_mgpu.Barrier(), collective_axes="wg")

  return plgpu_mgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,), grid_names=("cta",),
      num_threads=1, thread_name="wg",
      interpret=plgpu_mgpu.InterpretGPUParams() if interpret else False)(x)


def triton_add_one(x, interpret=False):
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        compiler_params=plgpu_triton.CompilerParams(num_warps=4),
                        interpret=interpret)(x)


def xla_add_one(x):
  return jnp.sin(x) + 1.0  # one fusion; sin keeps XLA from folding repeats together


def chain(fn, n):
  def run(x):
    for _ in range(n):
      x = fn(x)
    return x
  return jax.jit(run)


def spin_until_ready(tree) -> None:
  """Wait for every array of `tree` by polling, the host thread never sleeping."""
  for x in jax.tree.leaves(tree):
    while not x.is_ready():
      pass


LONG_PROGRAMS = ("matmul2", "matmul16", "moba", "cudnn")


def long_rows(calls: int, names=LONG_PROGRAMS) -> list[dict]:
  """Synchronised wall time against the GPU's span for programs of milliseconds."""
  from experiments.bench_kernel import dense_causal, fwd_bwd, inputs
  from pallas_kernels.moba import moba_attention

  def matmuls(n):
    def chain_of(x, w):
      for _ in range(n):
        x = jnp.dot(x, w)
      return x
    return chain_of

  x = jax.random.normal(jax.random.key(0), (8192, 8192), jnp.bfloat16) * 0.01
  t, block = 32768, 512
  q, k, v, do = inputs(0, 1, t, 16, 16, 128, jnp.bfloat16)
  seg, budget = jnp.ones((1, t), jnp.int32), jnp.asarray([3], jnp.int32)
  moba = lambda q, k, v: moba_attention(q, k, v, seg, budget, block_size=block, k_max=3,
                                        backend="mosaic")
  programs = {"matmul2": ("matmul x2", matmuls(2), (x, x)),
              "matmul16": ("matmul x16", matmuls(16), (x, x)),
              "moba": ("moba top-3 fwd+bwd", fwd_bwd(moba), (q, k, v, do)),
              "cudnn": ("cudnn fwd+bwd", fwd_bwd(dense_causal(False)), (q, k, v, do))}
  rows = []
  for name, fn, args in (programs[n] for n in names):
    f = clocked_call(fn)
    row = dict(program=name)
    for wait_name, wait in (("block", jax.block_until_ready), ("spin", spin_until_ready)):
      walls, spans = device_samples(f, *args, warmup=3, repeats=calls, wait=wait)
      row[f"{wait_name}_wall_ms"] = 1e3 * statistics.median(walls)
      row[f"{wait_name}_span_ms"] = 1e3 * statistics.median(spans)
      row[f"{wait_name}_host_ms"] = 1e3 * statistics.median(w - s for w, s in zip(walls, spans))
    row["pipelined_ms"] = 1e3 * time_pipelined(f, *args, calls=20, repeats=3)
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--long", action="store_true", help="also the programs of milliseconds")
  parser.add_argument("--calls", type=int, default=30, help="synchronised calls per --long row")
  parser.add_argument("--programs", nargs="+", choices=LONG_PROGRAMS, default=LONG_PROGRAMS,
                      help="the --long programs to run")
  parser.add_argument("--skip-small", action="store_true", help="only the --long programs")
  parser.add_argument("--out", help="write every row to this JSON file")
  args = parser.parse_args()
  x = jnp.zeros((128, 128), jnp.float32)
  rows = []
  for name, fn in () if args.skip_small else (("xla", xla_add_one), ("triton", triton_add_one),
                                              ("mosaic", mosaic_add_one)):
    for n in (1, 3, 6):
      f = chain(fn, n)
      rows.append(dict(kind=name, kernels=n,
                       sync_ms=1e3 * time_call(f, x, warmup=3, repeats=50),
                       pipelined_ms=1e3 * time_pipelined(f, x, calls=50, repeats=3)))
      print(json.dumps(rows[-1]), flush=True)
  long = long_rows(args.calls, args.programs) if args.long else []
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(small=rows, long=long), f, indent=1)
  print("\n| kernels | kind | synchronised ms | back to back ms |")
  print("|---:|---|---:|---:|")
  for r in rows:
    print(f"| {r['kernels']} | {r['kind']} | {r['sync_ms']:.3f} | {r['pipelined_ms']:.3f} |")
  if long:
    print("\n| program | wall (block) | GPU span | host | wall (spin) | GPU span | host | "
          "back to back |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in long:
      print(f"| {r['program']} | {r['block_wall_ms']:.3f} | {r['block_span_ms']:.3f} | "
            f"{r['block_host_ms']:.3f} | {r['spin_wall_ms']:.3f} | {r['spin_span_ms']:.3f} | "
            f"{r['spin_host_ms']:.3f} | {r['pipelined_ms']:.3f} |")


if __name__ == "__main__":
  main()
