"""A GPU's own nanosecond clock, read inside a jitted program (Pallas Triton, inline PTX).

`read_clock(dep)` returns the low 32 bits of the GPU's `%globaltimer` (nanoseconds, one clock
for every SM of the device) once `dep` is computed. Placed at the start and the end of a
program with data dependencies (`clocked(fn)`), two readings give the time the device itself
spent on the program, free of when the host got round to launching it on that device.
The counter wraps every 2^32 ns (4.3 s): `elapsed_seconds` takes the difference modulo 2^32
and adds back the whole wraps a bound on the true time (the host's wall time) leaves room for.

GPU only: inline PTX has no interpreter, so any other backend is an error.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_LANES = 16  # smallest block the Triton lowering handles comfortably
_WRAP_NS = 1 << 32


def _clock_kernel(dep_ref, out_ref):
  (now,) = plgpu.elementwise_inline_asm(
      "mov.u32 $0, %globaltimer_lo;", args=[dep_ref[...]], constraints="=r,r", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(dep_ref.shape, jnp.int32)])
  out_ref[...] = now


def read_clock(dep: jax.Array) -> jax.Array:
  """int32 [16]: the device clock's low 32 bits, read after `dep` (any array) is ready."""
  if jax.default_backend() != "gpu":
    raise ValueError(f"read_clock needs a GPU (inline PTX), the backend is "
                     f"{jax.default_backend()!r}")
  lanes = jnp.zeros((_LANES,), jnp.int32) + dep.reshape(-1)[0].astype(jnp.int32)
  return pl.pallas_call(
      _clock_kernel,
      out_shape=jax.ShapeDtypeStruct((_LANES,), jnp.int32),
      compiler_params=plgpu.CompilerParams(num_warps=1, num_stages=1),
      name="device_clock",
  )(lanes)


def clocked(fn):
  """fn -> (*args) -> (fn(*args), int32 [2, 16]): the clock read once every numeric operand
  is ready, before fn's first kernel, and after its last. Optimization barriers order the
  readings: fn's operands pass through one with the first reading, its results through one
  with the first reading again, which the second reading then depends on. Trace it inside
  jit. An error under XLA's concurrent command buffers (_check_ordered_schedule)."""
  _check_ordered_schedule()

  def run(*args):
    firsts = [x.reshape(-1)[0].astype(jnp.float32) for x in jax.tree.leaves(args)
              if jnp.issubdtype(x.dtype, jnp.number)]
    # A sum, not the stack itself: read_clock looks at one element, and XLA would drop the
    # operands that element does not depend on.
    start = read_clock(jnp.stack(firsts).sum())
    start, args = lax.optimization_barrier((start, args))
    out, start = lax.optimization_barrier((fn(*args), start))
    return out, jnp.stack([start, read_clock(start)])
  return run


def _check_ordered_schedule() -> None:
  """clocked's readings bracket a program only where its kernels run in the program's order.
  XLA's command buffers run them in that order unless XLA_FLAGS sets
  --xla_gpu_command_buffer_scheduling_mode=CONCURRENT, under which a kernel waits only for the
  kernels that wrote its buffers; the optimization barriers that order the readings write
  none, so the program's first kernels start before the first reading. On the H200 the MoBA
  step then read 3.354 ms on this clock against 3.545-3.592 ms of traced GPU span
  (BENCHMARKS.md): a reading that would flatter any program, so it is refused."""
  for flag in os.environ.get("XLA_FLAGS", "").split():
    name, _, value = flag.lstrip("-").partition("=")
    if name == "xla_gpu_command_buffer_scheduling_mode" and value.upper() == "CONCURRENT":
      raise ValueError(
          f"XLA_FLAGS sets {flag}: the device clock's readings are not ordered against the "
          "program's kernels under concurrent command buffers, so its times would be too "
          "short; time without that flag")


def elapsed_seconds(start_XL: np.ndarray, end_XL: np.ndarray, *,
                    at_most_seconds: float | None = None) -> np.ndarray:
  """Seconds between two readings ([..., 16] int32 clocks -> [...]; lane 0 of each). The
  low 32 bits wrap every 2^32 ns (4.3 s): the difference is taken modulo 2^32, plus the whole
  wraps that `at_most_seconds` (a bound on the true time, such as the host's wall time around
  the program) leaves room for."""
  start = np.asarray(start_XL)[..., 0].astype(np.uint32).astype(np.int64)
  end = np.asarray(end_XL)[..., 0].astype(np.uint32).astype(np.int64)
  wrapped_ns = (end - start) % _WRAP_NS
  if at_most_seconds is not None:
    wraps = np.maximum((int(at_most_seconds * 1e9) - wrapped_ns) // _WRAP_NS, 0)
    wrapped_ns = wrapped_ns + wraps * _WRAP_NS
  return wrapped_ns / 1e9
