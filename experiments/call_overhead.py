"""What one synchronised call costs beyond its GPU work, by kind of kernel: a trivial XLA
computation, a minimal Pallas Mosaic GPU kernel, a minimal Pallas Triton kernel, and 1 / 3 / 6
of each in one jitted function (each kernel adds 1 to a small array - the XLA one takes the
sine first - so the GPU work is a few microseconds). Per variant: ms per call synchronised
(median of 50, the project's rule) and back to back (50 calls, one wait). GPU only.

    python -m experiments.call_overhead
"""

import json

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu_mgpu
from jax.experimental.pallas import triton as plgpu_triton

from sparsebalance_jax.balance.timing import time_call, time_pipelined


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


def main():
  x = jnp.zeros((128, 128), jnp.float32)
  rows = []
  for name, fn in (("xla", xla_add_one), ("triton", triton_add_one),
                   ("mosaic", mosaic_add_one)):
    for n in (1, 3, 6):
      f = chain(fn, n)
      rows.append(dict(kind=name, kernels=n,
                       sync_ms=1e3 * time_call(f, x, warmup=3, repeats=50),
                       pipelined_ms=1e3 * time_pipelined(f, x, calls=50, repeats=3)))
      print(json.dumps(rows[-1]), flush=True)
  print("\n| kernels | kind | synchronised ms | back to back ms |")
  print("|---:|---|---:|---:|")
  for r in rows:
    print(f"| {r['kernels']} | {r['kind']} | {r['sync_ms']:.3f} | {r['pipelined_ms']:.3f} |")


if __name__ == "__main__":
  main()
