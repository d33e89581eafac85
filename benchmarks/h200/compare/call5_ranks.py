"""Call 5 (2026-11-30): the layout's ranks by kernels.block_read_ranks - bd5447d's kernel with
each slot's comparison rebuilt where it is used and 8 warps, run from a working tree that
held it and not kept, so this script does not run at later commits - against the running
count build_kv_layout keeps (gating._count_reads_up_to; the script as run restated the same
function inline), on the fused gate's selection at several shapes: equal ranks and counts,
and each one's time (50 calls back to back, median of 3), then the whole gating
(gate_and_layout) with the kernel (synchronised median of 20).

    python3 benchmarks/h200/compare/call5_ranks.py
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
from experiments.bench_kernel import inputs  # noqa: E402
from pallas_kernels.moba import MobaBlockSizes, gating, kernels  # noqa: E402
from pallas_kernels.moba.attention import _fused_gate, gate_and_layout  # noqa: E402
from sparsebalance_jax.balance.timing import time_call, time_pipelined  # noqa: E402


def running_count_ranks(sel_BGTK, n):
  """The layout's ranks and counts as build_kv_layout computes them."""
  csum = gating._count_reads_up_to(sel_BGTK, n)
  return jnp.take_along_axis(csum, jnp.minimum(sel_BGTK, n - 1), axis=3) - 1, csum[:, :, -1]


rows = []
for t, block, k, hq in ((32768, 512, 3, 16), (32768, 512, 8, 16), (32768, 512, 16, 16),
                        (32768, 256, 8, 14), (65536, 256, 3, 16)):
  hkv = 2 if hq == 14 else 16
  d = 64 if hq == 14 else 128
  q, kk, v, _ = inputs(0, 1, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((1, t), jnp.int32)
  budget = jnp.asarray([k], jnp.int32)
  n = t // block
  sel = jax.jit(lambda q, kk: _fused_gate(q, kk, seg, budget, block_size=block, k_max=k,
                                          interpret=False))(q, kk)
  sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
  old = jax.jit(lambda s: running_count_ranks(s, n))
  new = jax.jit(lambda s: kernels.block_read_ranks(s, num_blocks=n, interpret=False))
  (ro, co), (rn, cn) = old(sel_BGTK), new(sel_BGTK)
  used = np.asarray(sel_BGTK) < n
  same = bool((np.asarray(co) == np.asarray(cn)).all()
              and (np.where(used, np.asarray(ro), 0) == np.where(used, np.asarray(rn), 0)).all())
  t_old = 1e3 * time_pipelined(old, sel_BGTK, calls=50, repeats=3)
  t_new = 1e3 * time_pipelined(new, sel_BGTK, calls=50, repeats=3)
  gate_fn = jax.jit(lambda q, kk: gate_and_layout(q, kk, seg, budget, block_size=block, k_max=k,
                                                  bs=MobaBlockSizes(), interpret=False,
                                                  backend="mosaic"))
  t_gate = 1e3 * time_call(gate_fn, q, kk, warmup=3, repeats=20)
  rows.append((t, block, k, f"{hq}/{hkv}x{d}", same, t_old, t_new, t_gate))
  print(rows[-1], flush=True)

print("S      block k   heads      equal  running count ms  kernel ms  gating sync ms")
for t, block, k, h, same, a, b, c in rows:
  print(f"{t:6d} {block:4d} {k:3d}  {h:9s}  {str(same):5s}  {a:16.3f}  {b:9.3f}  {c:9.3f}")
