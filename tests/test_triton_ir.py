"""experiments/triton_ir.py: the MoBA kernels lowered to Triton IR for an H200 on a CPU host."""

import os

import jax
import jax.numpy as jnp

from experiments.triton_ir import lower_kernels, ttgir_summary
from pallas_kernels.moba import MobaBlockSizes, moba_attention


def test_lowers_every_kernel_of_a_training_step():
  bs = MobaBlockSizes(block_rows=16, block_k=32, block_k_dkv=32, num_warps_bwd=8,
                      skip_full_masks=False)  # one loop per kernel (no unmasked copy)
  seq, hq, hkv, d = 512, 2, 1, 32  # k_max 8: the merges run in their kernels too

  def step(q, k, v, seg, budget):
    loss = lambda q, k, v: moba_attention(q, k, v, seg, budget, block_size=64, k_max=8,
                                          block_sizes=bs).astype(jnp.float32).sum()
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  shape = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  kernels = lower_kernels(step, shape(1, seq, hq, d), shape(1, seq, hkv, d),
                          shape(1, seq, hkv, d), jax.ShapeDtypeStruct((1, seq), jnp.int32),
                          jax.ShapeDtypeStruct((1,), jnp.int32))
  by_name = {k["name"]: k for k in kernels}
  assert sorted(by_name) == ["moba_dkv", "moba_dq", "moba_fwd", "moba_gate_topk", "moba_merge",
                            "moba_merge_dq"]
  # The merges loop over a tile's used slots only: a loop, and the slot rows gathered in it.
  for name in ("moba_merge", "moba_merge_dq"):
    assert "scf.for" in by_name[name]["ttir"], name
  assert (by_name["moba_fwd"]["num_warps"], by_name["moba_dq"]["num_warps"]) == (4, 8)
  assert "tt.func public @moba_fwd" in by_name["moba_fwd"]["ttir"]
  assert by_name["moba_fwd"]["ttir"].count("tt.dot ") == 2  # QK^T and PV
  for name in ("moba_fwd", "moba_dq", "moba_dkv"):  # MobaBlockSizes.fast_exp2 (the default)
    assert "ex2.approx.ftz.f32" in by_name[name]["ttir"], name


def test_ttgir_summary_reads_waits_and_layouts():
  # An Ampere-style layout next to a Hopper one, async and awaited products.
  ttgir = "\n".join([
      "#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1], "
      "instrShape = [16, 32, 16]}>",
      "#mma1 = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [4, 1], "
      "instrShape = [16, 8]}>",
      "%1 = ttng.warp_group_dot %a, %b, %c {isAsync = true} : x",
      "%2:3 = ttng.warp_group_dot_wait %1, %a, %b {pendings = 0 : i32} : x",
      "%3 = ttng.warp_group_dot %d, %e, %f {isAsync = true} : x",
      "%4:2 = ttng.warp_group_dot_wait %3, %e {pendings = 1 : i32} : x",
      "%5 = ttg.async_copy_global_to_local %p, %q : x",
      "%6 = ttg.convert_layout %s : x"])
  s = ttgir_summary(ttgir)
  assert (s["wgmma_dots"], s["dot_waits"], s["dot_waits_pending_0"], s["async_copies"],
          s["layout_conversions"], s["mma_v2_layouts"]) == (2, 2, 1, 1, 1, 1)
  assert s["mma_layouts"] == [("[4, 1]", "[16, 8]"), ("[8, 1]", "[16, 32, 16]")]


def test_ttgir_summary_on_compiled_kernel_lines():
  """Lines of the 8-warp forward's TTGIR as upstream triton 3.6.0 compiled it
  (experiments/triton_ir.py --compile): two products, two waits (QK^T's in the loop, the
  accumulating PV's after it), QK^T on a 16 x 32 instruction across [8, 1] warps."""
  with open(os.path.join(os.path.dirname(__file__), "fixtures", "triton",
                         "moba_fwd_w8.ttgir.txt")) as f:
    s = ttgir_summary(f.read())
  assert (s["wgmma_dots"], s["dot_waits"], s["dot_waits_pending_0"], s["mma_v2_layouts"]) == (
      2, 2, 2, 0)
  assert (s["async_copies"], s["layout_conversions"]) == (6, 5)
  assert s["mma_layouts"] == [("[4, 2]", "[16, 64, 16]"), ("[8, 1]", "[16, 32, 16]")]
