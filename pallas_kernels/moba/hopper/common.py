"""What the Hopper kernels share: the tile constants, the checks of operands and device, the
persistent launch (with its on-chip profiler), the compute warpgroups' turns and products on
the tensor cores, and operands put into sorted-row order.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.moba import kernels
from pallas_kernels.moba.kernels import MobaBlockSizes

_ROWS = 64  # one warpgroup's wgmma M
DKV_TILE = 2 * _ROWS  # keys per dk/dv work item: one 64-key half per compute warpgroup


def _smem_transforms(dtype) -> tuple:
  """wgmma operand layout in shared memory: 8-row tiles of 128 bytes, 128-byte swizzle."""
  per_128b = 128 // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, per_128b)), plgpu.SwizzleTransform(128))


def check_supported(q_dtype, head_dim: int, bs: MobaBlockSizes, block_size: int) -> None:
  """Raises with the reason when the Hopper kernels (forward, dq, dk/dv) cannot run these
  arguments."""
  _check_operands(q_dtype, head_dim, bs)
  if block_size % DKV_TILE:
    raise ValueError(f"the Mosaic GPU dk/dv kernel needs block_size % {DKV_TILE} == 0 (its "
                     f"key tiles), got {block_size}")


def _check_operands(q_dtype, head_dim: int, bs: MobaBlockSizes) -> None:
  if jnp.dtype(q_dtype) != jnp.bfloat16:
    raise ValueError(f"the Mosaic GPU kernels take bfloat16 q/k/v, got {jnp.dtype(q_dtype)}; "
                     "use backend='triton' for other dtypes")
  if head_dim not in (64, 128):
    # Their tiles and pipeline depths are sized to the H200's shared memory at these two
    # (test_kernels_fit_h200_shared_memory); wider heads overflow it.
    raise ValueError(f"the Mosaic GPU kernels take head_dim 64 or 128, got {head_dim}")
  if bs.block_rows != _ROWS:
    raise ValueError(f"the Mosaic GPU kernels need MobaBlockSizes.block_rows == {_ROWS}, got "
                     f"{bs.block_rows}")


# Host devices Mosaic GPU's interpret mode needs on CPU. It runs each simulated warpgroup as
# an XLA computation of its own, on its own Python thread, and they wait on one another at
# their barriers; with too few host devices the CPU client cannot run them all at once and
# the call never returns. Measured on 2 cores (the notebook's kernels, up to 4 warpgroups):
# hung at 1, 2 and 3 host devices, ran at 4 and 8 (the test suite's).
INTERPRET_MIN_HOST_DEVICES = 4


def check_device(interpret) -> None:
  """Raises unless the kernels can run where they are called: compiled, on a Hopper GPU
  (compute capability 9.x: wgmma and TMA); interpreted, on a GPU or on enough CPU host
  devices (INTERPRET_MIN_HOST_DEVICES)."""
  device = jax.devices()[0]
  if interpret:
    if device.platform == "cpu" and jax.device_count() < INTERPRET_MIN_HOST_DEVICES:
      raise ValueError(
          f"the Mosaic GPU kernels' interpret mode on CPU needs at least "
          f"{INTERPRET_MIN_HOST_DEVICES} host devices (its warpgroups run as computations that "
          f"wait on one another; with fewer they never finish); this process has "
          f"{jax.device_count()}: start it with XLA_FLAGS="
          f"--xla_force_host_platform_device_count={INTERPRET_MIN_HOST_DEVICES}")
    return
  if device.platform != "gpu" or not str(getattr(device, "compute_capability", "")).startswith(
      "9"):
    raise ValueError(f"the Mosaic GPU kernels (backend='mosaic') run compiled on Hopper GPUs "
                     f"(compute capability 9.x), not on {device.device_kind!r} "
                     f"({device.platform}): use backend='triton' or interpret=True")


def _interpret_params(interpret):
  """interpret: False (compile), True (GPU interpret mode) or the interpreter's own
  parameters (e.g. plgpu.InterpretGPUParams(detect_races=True), as the tests run it)."""
  if isinstance(interpret, plgpu.InterpretGPUParams):
    return interpret
  return plgpu.InterpretGPUParams() if interpret else False


ITEM_ROWS = 2 * _ROWS  # rows per work item: one 64-row half per compute warpgroup


def _trips(num, grid):
  """Items this CTA runs: cta, cta + grid, ... below the item count `num`."""
  return jnp.maximum(num - lax.axis_index("cta") + grid - 1, 0) // grid


def _consumer_setup(frees, registers: int = 232):
  """A compute warpgroup's start: its registers per thread, and every buffer of `frees` (the
  barriers the compute warpgroups arrive on once they are done with a buffer) freed once."""
  plgpu.set_max_registers(registers, action="increase")
  for free in frees:
    plgpu.barrier_arrive(free)


def _turns(turn):
  """The two compute warpgroups' turns on the tensor cores, in strict alternation
  (FlashAttention-3's ping-pong; `turn`: two barriers of one arrival): wait_turn() waits for
  this warpgroup's, end_turn() hands it to the other once this one's products are issued.
  Warpgroup 0 goes first; both must take equally many turns, then call finish() (which
  observes the turn warpgroup 1 hands on last). turn=None (no ping-pong): each warpgroup
  issues its products as soon as their operands are ready, and all three do nothing."""
  if turn is None:
    nothing = lambda: None
    return nothing, nothing, nothing
  wg = lax.axis_index("wg")
  pl.when(wg == 1)(lambda: plgpu.barrier_arrive(turn.at[0]))
  wait_turn = lambda: plgpu.barrier_wait(turn.at[wg])
  end_turn = lambda: plgpu.barrier_arrive(turn.at[1 - wg])
  return wait_turn, end_turn, lambda: pl.when(wg == 0)(wait_turn)


def _mma_turn(turn, accs, products, p_smem, name):
  """accs[i] + a_i @ b_i for each (a_i, b_i) of `products` (a_i from registers), issued in
  one turn on the tensor cores (turn: _turns' wait_turn, end_turn) and waited for (the issue
  and the wait are the named region `name`); with p_smem (interpret mode) through
  _accumulate."""
  wait_turn, end_turn = turn
  with jax.named_scope("turn"):
    wait_turn()
  if p_smem is not None:
    end_turn()
    return tuple(_accumulate(acc, a, b, p_smem) for acc, (a, b) in zip(accs, products))

  def mma(refs):
    for ref, (a, b) in zip(refs, products):
      plgpu.wgmma(ref, a, b)
    end_turn()

  with jax.named_scope(name):
    return pl.run_state(mma)(tuple(plgpu.ACC.init(acc) for acc in accs))


def _await_last_frees(frees):
  """A streaming warpgroup's end: the compute warpgroups free every buffer once more than it
  was filled (they free them all at the start); observing those last phases also waits for
  them to finish."""
  for free in frees:
    plgpu.barrier_wait(free)


def _slots(bar, n):
  return [bar.at[i] for i in range(n)]


def _per_row(ref, shape):
  """A 64-entry ref (one value per row of a wgmma tile, shared or global memory) loaded and
  broadcast across the columns of `shape`."""
  return lax.broadcast_in_dim(
      plgpu.load(ref, layout=plgpu.Layout.WGMMA.reduce(1), optimized=False), shape, [0])


def _accumulate(acc, a, b_ref, p_smem):
  """acc + a @ b_ref on wgmma with `a` from registers; with p_smem (interpret mode, whose
  wgmma takes shared-memory operands into a fresh accumulator only) through shared memory."""
  if p_smem is None:
    def mma(acc_ref):
      plgpu.wgmma(acc_ref, a, b_ref)

    return pl.run_state(mma)(plgpu.ACC.init(acc))
  p_smem[...] = a
  plgpu.commit_smem()

  def fresh(acc_ref):
    plgpu.wgmma(acc_ref, p_smem, b_ref)
    return acc_ref[...]

  return acc + pl.run_scoped(fresh, plgpu.ACC(acc.shape, jnp.float32))


def _check_layout(layout, block_size, block_kv):
  if layout.run_rows % ITEM_ROWS:
    raise ValueError(f"the Mosaic GPU kernels need a layout padded to {ITEM_ROWS} rows "
                     f"(build_kv_layout(..., pad_rows=hopper.ITEM_ROWS)), got runs padded "
                     f"to {layout.run_rows}")
  bkv = min(block_kv, block_size)
  if block_size % bkv or bkv % 64:
    raise ValueError(f"the Mosaic GPU kernels need block_kv % 64 == 0 dividing "
                     f"block_size={block_size}, got {bkv}")
  return bkv


def _grid(num_ctas, interpret):
  """Persistent CTAs: as given, else one per SM (four in interpret mode)."""
  if num_ctas is not None:
    return num_ctas
  return 4 if interpret else getattr(jax.devices()[0], "core_count", 132)


_PROFILE = contextvars.ContextVar("moba_hopper_profile", default=None)


@contextlib.contextmanager
def profile_kernels(directory: str, events: int):
  """Kernels built inside this block record their named regions (the `jax.named_scope`s of
  the kernel bodies) with Mosaic GPU's on-chip profiler: per warpgroup up to `events`
  begin/end events in shared memory (the rest dropped), written by each call as a Chrome
  trace into `directory`. The buffer shares shared memory with the kernel, so a kernel that
  leaves too little free fails to build. For diagnosis (experiments/profile_hopper.py):
  it changes the kernels' timing a little."""
  token = _PROFILE.set((directory, events))
  try:
    yield
  finally:
    _PROFILE.reset(token)


def _persistent_call(entry, out_type, *, name, num_ctas, warpgroups, interpret):
  """The Mosaic GPU kernel of `entry`: a 1-D grid of num_ctas persistent CTAs ("cta") of
  `warpgroups` warpgroups ("wg")."""
  profile = _PROFILE.get()
  extra = {} if profile is None else dict(profile_dir=profile[0], profile_space=profile[1],
                                           profile_bounds_check=True)
  return plgpu.kernel(
      entry,
      out_type=out_type,
      grid=(num_ctas,),
      grid_names=("cta",),
      num_threads=warpgroups,
      thread_name="wg",
      kernel_name=name,
      # No automatic warpgroup barriers around shared-memory reads, writes and copies: in
      # these kernels no thread reads a region it (or its warpgroup) also writes - operands
      # land by TMA and are read by threads or wgmma, outputs are written by threads and read
      # by TMA - and the ordering they need is explicit (mbarriers, commit_smem and the
      # copy waits, which carry their own warpgroup barrier). The automatic ones cost a
      # barrier per copy: 128 per item in the forward's row gather.
      compiler_params=plgpu.CompilerParams(approx_math=True, unsafe_no_auto_barriers=True,
                                           **extra),
      interpret=_interpret_params(interpret),
  )


def gather_rows(x_BSD, layout, interpret):
  """sorted_rows(x_BSD, layout) on the rows of every used work item (those the kernels
  read), by the Triton row-gather kernel (kernels.gather_rows)."""
  return kernels.gather_rows(x_BSD, layout, run_rows=ITEM_ROWS, interpret=bool(interpret))


def _sorted(x_BSD, x_rows, layout, interpret, name):
  """An operand's rows in sorted order for a backward kernel: {name}_rows as given
  (checked), else gathered from {name}_BSD."""
  if x_rows is None:
    if x_BSD is None:
      raise ValueError(f"give {name}_BSD or {name}_rows")
    return gather_rows(x_BSD, layout, interpret)
  want = (*layout.row_src_BGL.shape, x_rows.shape[-1])
  if x_rows.shape != want:
    raise ValueError(f"{name}_rows must be [B, G, L, D] = {want} (the layout's sorted rows), "
                     f"got {x_rows.shape}")
  return x_rows


def sorted_rows(x_BSX, layout):
  """[B, T * Hq, X...] -> [B, G, L, X...]: each sorted row's value (padding rows: row 0's)."""
  b, g, l = layout.row_src_BGL.shape
  idx = layout.row_src_BGL.reshape(b, g * l, *([1] * (x_BSX.ndim - 2)))
  # row_src is in range on every row: no bounds handling in the gather.
  return jnp.take_along_axis(x_BSX, idx, axis=1, mode="promise_in_bounds").reshape(
      b, g, l, *x_BSX.shape[2:])
