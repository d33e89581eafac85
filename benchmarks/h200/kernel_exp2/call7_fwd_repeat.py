# Forward kernel GPU time with its tile loop run once, twice or three times over the same tiles
# (same prologue and epilogue), with call7_fwd_repeat.patch applied to kernels.py (a throwaway
# change, not in the library): MOBA_FWD_REPEAT=r python3 call7_fwd_repeat.py from the repo root.
import os, sys, json
sys.path.insert(0, os.getcwd())
import jax, jax.numpy as jnp
from experiments.bench_kernel import inputs
from experiments.trace_moba import traced_kernel_us
from pallas_kernels.moba import MobaBlockSizes, build_kv_layout, kernels
from pallas_kernels.moba.attention import _fused_gate
for heads, block, k in (((16, 16, 128), 512, 3), ((14, 2, 64), 256, 8)):
  hq, hkv, d = heads
  t = 32768
  q, kk, v, do = inputs(0, 1, t, hq, hkv, d, jnp.bfloat16)
  seg = jnp.ones((1, t), jnp.int32); budget = jnp.asarray([k], jnp.int32)
  bs = MobaBlockSizes().fit(block, d)
  sel = _fused_gate(q, kk, seg, budget, block_size=block, k_max=k, interpret=False)
  lay = build_kv_layout(sel, seg, num_blocks=t // block, group_size=hq // hkv, block_rows=64, mark_full=bs.skip_full_masks)
  f = jax.jit(lambda q, kk, v: kernels.moba_forward_rows(q.reshape(1, t * hq, d), lay, kk, v, seg, block_size=block, bs=bs, interpret=False))
  ks, _ = traced_kernel_us(f, q, kk, v, reps=10)
  print(json.dumps({"repeat": kernels.REPEAT, "heads": heads, "block": block, "k": k, "fwd_us": ks["moba_fwd"][0] / 10}), flush=True)
