"""The MoBA kernels as Triton compiles them for the H200, without a GPU: each kernel's Triton IR
(TTIR) from an ahead-of-time lowering for an abstract H200, and with --compile its TTGIR, PTX,
shared memory, registers and the structure that decides its speed (wgmma layouts, where the
wgmma waits sit, asynchronous copies).

    python -m experiments.triton_ir --heads h128 --block 512 --k 3 \\
        --variants "64,64,64,4,2;128,64,64,8,2,0" --out-dir /tmp/moba_ir --compile

--compile needs the `triton` package (3.6, the GPU image's version; not a project requirement:
`pip install triton==3.6.0` into any Python 3.12 environment) and runs on CPU. Its compiler is
upstream Triton, not the fork inside XLA that compiles the kernels on the GPU: shared memory per
CTA matched Nsight Compute's reading of the XLA-compiled kernels exactly at the headline point
(82,176 / 98,560 / 107,520 bytes for forward / dq / dk-dv); registers did for the forward and
dk/dv (161 / 255 here, 164 / 255 there) but not for dq (177 against 236), so read registers as
indicative only, and the IR as a model of what XLA's fork compiles, not a copy of it.

The TTIR is read from the lowered module's `__gpu$xla.gpu.triton` custom calls (their
backend_config holds it as MLIR bytecode) and printed with JAX's MLIR context and Triton
dialect - JAX internals (jax._src), pinned by the project's JAX version.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments.bench_kernel import (HEADS, add_point_args, parse_variant, point_fields,  # noqa: E402
                                     variant_tag)
from pallas_kernels.moba import moba_attention  # noqa: E402

H200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")


def lower_for_h200(fn, *arg_shapes):
  """jax.jit(fn) traced on arg_shapes and lowered for an H200, on any host (no GPU needed):
  the Lowered, whose text holds every kernel's custom call."""
  with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=H200)):
    return jax.jit(fn).trace(*arg_shapes).lower(lowering_platforms=("cuda",))


def lower_kernels(fn, *arg_shapes) -> list[dict]:
  """[{name, num_warps, num_stages, ttir}] of every Pallas Triton kernel in jit(fn), lowered for
  an H200 on any host."""
  from jax._src.interpreters import mlir  # noqa: PLC0415  (JAX internals: see the docstring)
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.triton import dialect as tt_dialect  # noqa: PLC0415

  lowered = lower_for_h200(fn, *arg_shapes)
  calls = []

  def walk(op):
    for region in op.regions:
      for block in region:
        for inner in block:
          if (inner.name == "stablehlo.custom_call"
              and ir.StringAttr(inner.attributes["call_target_name"]).value
              == "__gpu$xla.gpu.triton"):
            calls.append(ir.DictAttr(inner.attributes["mhlo.backend_config"]))
          walk(inner)

  walk(lowered.compiler_ir("stablehlo").operation)
  ctx = mlir.make_ir_context()
  tt_dialect.register_dialect(ctx)
  out = []
  for cfg in calls:
    module = ir.Module.parse(ir.StringAttr(cfg["ir"]).value_bytes, context=ctx)
    out.append({"name": ir.StringAttr(cfg["name"]).value,
                "num_warps": ir.IntegerAttr(cfg["num_warps"]).value,
                "num_stages": ir.IntegerAttr(cfg["num_stages"]).value,
                "ttir": module.operation.get_asm(enable_debug_info=False)})
  return out


def ttgir_summary(ttgir: str) -> dict:
  """What decides a kernel's speed, read from its TTGIR."""
  waits = re.findall(r"warp_group_dot_wait .*?\{pendings = (\d+)", ttgir)
  return {
      "wgmma_dots": len(re.findall(r"ttng\.warp_group_dot ", ttgir)),
      "mma_v2_layouts": len(re.findall(r"nvidia_mma<\{versionMajor = 2", ttgir)),
      "dot_waits": len(waits),
      "dot_waits_pending_0": sum(w == "0" for w in waits),
      "async_copies": len(re.findall(r"async_copy_global_to_local", ttgir)),
      "layout_conversions": len(re.findall(r"ttg\.convert_layout", ttgir)),
      "mma_layouts": sorted(set(re.findall(
          r"nvidia_mma<\{versionMajor = \d+, versionMinor = \d+, warpsPerCTA = (\[[\d, ]+\]), "
          r"instrShape = (\[[\d, ]+\])", ttgir))),
  }


def compile_kernel(kernel: dict, path: str) -> dict:
  """Compiles a TTIR file with the `triton` package for sm_90: first the TTIR passes (combining
  `acc + dot(a, b)` into an accumulating dot, among others - triton.compile skips them for an
  IR file), then the rest; writes the optimized .opt.ttir, .ttgir and .ptx beside it."""
  try:
    import triton  # noqa: PLC0415
    from triton._C.libtriton import ir as triton_ir  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget, Language  # noqa: PLC0415
    from triton.compiler.compiler import make_backend  # noqa: PLC0415
  except ImportError as e:
    raise SystemExit(f"--compile needs the triton package (pip install triton==3.6.0): {e}")
  target = GPUTarget("cuda", 90, 32)
  options = {"num_warps": kernel["num_warps"], "num_stages": kernel["num_stages"]}
  backend = make_backend(target)
  ctx = triton_ir.context()
  triton_ir.load_dialects(ctx)
  backend.load_dialects(ctx)
  module = triton_ir.parse_mlir_module(path, ctx)
  module.context = ctx
  stages = {}
  backend.add_stages(stages, backend.parse_options(options), Language.TRITON)
  base = os.path.splitext(path)[0]
  with open(f"{base}.opt.ttir", "w") as f:
    f.write(str(stages["ttir"](module, {})))
  compiled = triton.compile(f"{base}.opt.ttir", target=target, options=options)
  for key in ("ttgir", "ptx"):
    with open(f"{base}.{key}", "w") as f:
      f.write(compiled.asm[key])
  with open(f"{base}.cubin", "wb") as f:
    f.write(compiled.asm["cubin"])
  cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                           "cuobjdump")
  usage = subprocess.run([cuobjdump, "--dump-resource-usage", f"{base}.cubin"],
                         capture_output=True, text=True, check=True).stdout
  regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
  return {"shared_bytes": compiled.metadata.shared, "registers": int(regs),
          "stack_bytes": int(stack), **ttgir_summary(compiled.asm["ttgir"])}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_point_args(p)
  p.add_argument("--variants", default="64,64,64,4,2", help="bench_kernel.py variant syntax")
  p.add_argument("--out-dir", required=True)
  p.add_argument("--compile", action="store_true", help="compile with the triton package")
  args = p.parse_args()
  hq, hkv, d = HEADS[args.heads]
  os.makedirs(args.out_dir, exist_ok=True)
  shape = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  b = args.batch
  arg_shapes = (shape(b, args.seq, hq, d), shape(b, args.seq, hkv, d), shape(b, args.seq, hkv, d),
                shape(b, args.seq, hq, d), jax.ShapeDtypeStruct((b, args.seq), jnp.int32),
                jax.ShapeDtypeStruct((b,), jnp.int32))
  rows = []
  for text in args.variants.split(";"):
    bs = parse_variant(text)
    tag = variant_tag(bs.fit(args.block, d))

    def step(q, k, v, do, seg, budget, bs=bs):
      def loss(q, k, v):
        out = moba_attention(q, k, v, seg, budget, block_size=args.block, k_max=args.k,
                             block_sizes=bs)
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
      return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    for kernel in lower_kernels(step, *arg_shapes):
      path = os.path.join(args.out_dir, f"{tag}.{kernel['name']}.ttir")
      with open(path, "w") as f:
        f.write(kernel["ttir"])
      row = {**point_fields(args), "variant": tag, "kernel": kernel["name"],
             "num_warps": kernel["num_warps"], "num_stages": kernel["num_stages"], "ttir": path}
      if args.compile:
        row.update(compile_kernel(kernel, path))
      rows.append(row)
      print(json.dumps({k: v for k, v in row.items() if k != "ttir"}), flush=True)
  with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
