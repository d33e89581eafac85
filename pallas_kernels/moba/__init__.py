"""MoBA block-sparse attention with a per-row runtime budget (Pallas kernels + reference).

Public API::

    out_BTHD = moba_attention(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *,
                              block_size, k_max, block_sizes=None, backend="triton",
                              interpret=False)
    sel = moba_gate(q_BTHD, k_BTKD, segment_ids_BT, budget_B, *, block_size, k_max)
    cov_B = moba_coverage(q_BTHD, k_BTKD, segment_ids_BT, budget_B, *, block_size, k_max)
    cov_BK = moba_coverage_curve(q_BTHD, k_BTKD, segment_ids_BT, *, block_size, k_max)
    ref_BTHD = moba_reference(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B, *,
                              block_size, k_max)

Semantics (exact; kernels and the dense reference compute the same function):

* Shapes: q [B, T, Hq, D], k/v [B, T, Hkv, D], Hq % Hkv == 0; bf16 or f32 (q, k, v
  share it; the output has it). T % block_size == 0; N = T / block_size KV blocks;
  1 <= k_max <= N (static). Block j holds tokens [j*block_size, (j+1)*block_size).
  The kernels' key tiles (powers of two >= 16, MobaBlockSizes) must divide
  block_size: with the defaults, a power of two from 16 to 64 or a multiple of 64.
  Each violation raises ValueError naming the argument.
* Segment ids (int [B, T]): 0 = padding, documents > 0. Rule: every document is a
  contiguous span of its row, i.e. between two tokens of a document there are only
  tokens of that document or padding (any packer produces this; documents need not
  start on block boundaries, though the project's packer aligns them). Concrete ids that
  break the rule (a document in two spans, a negative id) raise ValueError naming the row;
  traced ids cannot be checked without a host round trip, and are the caller's contract.
* Eligibility: block j is eligible for a query token t (block i, document s != 0)
  iff j < i and block j holds at least one token of document s.
* Gate key of block j for t: the mean of the keys of block j's tokens of document s
  (with aligned packing: the mean of the block's non-padding keys). Gate score
  = (sum of the KV group's query heads at t) . gate key, i.e. the sum over the
  group's heads of q_h . key, in float32 (bf16 hi/lo product passes, ~1e-5
  relative: gating.gate_dot).
* GQA: selection is shared by the Gh = Hq/Hkv query heads of a KV group (NSA-style).
  The group then reads each selected KV block once for all its heads, so the kernels
  run Gh times taller matmuls on the same K/V loads; per-head selection would load
  the same keys up to Gh times and split the work into smaller tiles.
* Budget k_b (budget_B[b], runtime data): the own block plus the top (k_b - 1)
  eligible blocks by gate score (ties: lower block index first); fewer when fewer
  are eligible. 1 <= k_b <= k_max is required: a concrete budget_B out of range
  raises ValueError at once; under jit (traced budget) the rows out of range get
  NaN outputs and NaN coverage (a host-callback check cost ~1 ms per call on the
  H200). Changing budgets never recompiles.
* Attention: exact softmax (scale 1/sqrt(D)) over the keys of the selected blocks
  and the own block, restricted to the same document and to key position <= query
  position (which binds only in the own block). Padding queries output 0 and get
  zero gradient; padding keys are never attended.
* Coverage of (t, group): softmax of the eligible gate scores, summed over the
  chosen blocks; 1.0 when all eligible blocks are chosen or none is eligible, and
  for padding tokens. `moba_coverage` averages it over a row's non-padding tokens
  and KV groups; `moba_coverage_curve` gives that at every budget 1..k_max in one pass.
* Gradients flow to q, k, v through attention only (selection is piecewise
  constant, as in MoBA). First order only: the kernels have no derivatives of their own, so
  differentiating the gradient again (grad of grad, a Hessian-vector product) fails inside
  JAX ("Linearization failed ..."); moba_reference has every order.
* Values: q, k and v must be finite everywhere, padding positions included; nothing checks
  it (a check would cost a pass over the inputs). A non-finite key reaches the gate keys of
  the blocks summed with it (a masked sum is a 0/1 product, and 0 x NaN is NaN), whose
  scores then count as ineligible, and a non-finite value reaches the outputs through the
  masked probabilities' products; the kernels and the reference need not agree on where.
* Segment ids must fit int32, as the kernels read them; concrete ids above it raise.

Kernel design (gate in gating.py, KV layout in kv_layout.py, attention kernels in kernels.py
and hopper/).
Gate: one Pallas kernel per (row, KV group, token tile) computes the scores against all
blocks, masks eligibility and keeps the top (k_b - 1) ids in registers - from k_max 4 on one
looped pass per pick up to the row's budget, below that every pass unrolled (the [B, T, G, N]
score tensor is never written; `moba_gate` is the XLA version with coverage and picks the same
blocks). From 256 blocks (up to 8 picks; past 512 at any) a program scores one chunk of 64
blocks and a second kernel merges the chunks' picks. Attention: KV-centric. The gate's
(token, slot) picks are sorted by KV block, per (row, KV group); each block's run of
(token, head) rows is padded to a multiple of `block_rows`, so every chunk of
`block_rows` rows reads exactly one block and no pair outside the selection is
computed except within the partly filled last chunk of each block. The forward and
dq kernels run one program per chunk; dk/dv loop over the chunks of their block
with data-dependent bounds, so time falls with the budget and no shape depends on
it. A query-centric design over the union of a query tile's selections computes
and masks pairs no token asked for (the union of 64 tokens' top-k blocks is often
most of the prefix), which the useful-FLOP metric does not count. That choice was
made on this count, not by timing a query-centric kernel.

Measured (BENCHMARKS.md, H200, bf16, S=32K, block 512, 16 heads, D=128): top-3
forward+backward 0.517-0.546x cuDNN dense causal's useful-FLOP rate with backend="mosaic"
(hopper/: forward, dq and dk/dv in Pallas Mosaic GPU, persistent and warp-specialized;
synchronised wall clock; 0.544-0.558x back to back, 0.555-0.584x on the GPU's own clock;
0.605-0.652x / 0.647-0.676x at top-8 / 16) and 0.39-0.41x with the Triton kernels: the 0.6x
target at top-3 is not reached. At 14/2 heads x 64 the Hopper kernels are the faster too
(0.452x at top-3, 0.506x on the GPU's clock; 0.596x at top-8). Time linear in the budget (R^2
0.998 with the Hopper kernels, 0.999 with the Triton ones; k=2..16, one compile); the gating
7.6% of the step's GPU time.
"""

# Imported for its side effect, before any kernel module: it registers a Pallas config flag
# in JAX's trace context. Left to the first pallas_call to import lazily, that registration
# changes the context mid-run, so a function jitted before it compiles twice.
from jax.experimental.pallas import fuser as _fuser  # noqa: F401

from pallas_kernels.moba.attention import moba_attention
from pallas_kernels.moba.gating import (MobaSelection, moba_coverage, moba_coverage_curve,
                                        moba_gate)
from pallas_kernels.moba.kv_layout import MobaKVLayout, build_kv_layout
from pallas_kernels.moba.kernels import MobaBlockSizes
from pallas_kernels.moba.reference import moba_reference

__all__ = ["MobaBlockSizes", "MobaKVLayout", "MobaSelection", "build_kv_layout",
           "moba_attention", "moba_coverage", "moba_coverage_curve", "moba_gate",
           "moba_reference"]
