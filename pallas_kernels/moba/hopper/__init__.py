"""Pallas Mosaic GPU (Hopper: TMA, wgmma, warp specialization) kernels on the KV-centric
layout - forward, dq and dk/dv - with FlashAttention-3's structure, made persistent: the
`backend="mosaic"` kernel set of moba_attention.

Same contracts as kernels.moba_forward_rows / moba_dq_rows / moba_dkv, so the glue in
attention.py does not change. What differs:

* One CTA per SM, walking a list of work items (cta, cta + grid, ...); two compute
  warpgroups issue their products to the tensor cores, with P and dS fed to wgmma from
  registers - each as soon as its operands are ready, or (`pingpong`) in strict turns
  (_turns: FlashAttention-3's ping-pong, one's softmax or dS under the other's products).
  A turn issues one step's first products (forward QK^T; dq S and dP; dk/dv S^T and dP^T)
  or its update (PV; dS K; dV and dK); with `overlap` (dq at head_dim 128) a turn issues a
  step's first products together with the previous step's update, whose wait then falls
  after this step's elementwise work (FlashAttention-3's intra-warpgroup overlap). Which
  schedule each kernel runs by default depends on head_dim, as measured on the H200
  (BENCHMARKS.md).
* Forward and dq: items of ITEM_ROWS = 128 sorted rows, one 64-row half per compute
  warpgroup; the layout pads each block's run to 128 rows (build_kv_layout(pad_rows=
  ITEM_ROWS)), so an item reads one KV block and its halves share every K/V tile. A producer
  warpgroup streams the K and V tiles (`stages` slots each, or K's and V's: dq keeps a K
  tile until its dS K is done, a V tile only until dP) straight on from item to item; a fourth
  warpgroup brings the item's q (dq: and dO) rows into a staging buffer - gathered
  row by row by TMA after their ids (the swizzled wgmma tiles take no single-row copies), a
  token's query heads of one KV group (consecutive rows there and in q) as one box
  (_half_plans), or one box per half where the half is 64 consecutive tokens of one head (a
  block's own rows with one query head per KV group: box_halves) - and each compute
  warpgroup moves its half into its swizzled tiles; rows already in sorted order (q in dq)
  come as one box per half straight into the item's swizzled tile, one of two by item
  parity, so dq's output can leave through it while the next item's rows arrive. The
  forward can store the q rows it gathered, in sorted order (sorted_q), and dq the dO rows
  (sorted_do), for the backward. The key tiles an item attends whole - all of a later
  block's, the ones before the diagonal of an own-block item - run without the mask;
  own-block items stop after their last query's key tile.
* dk/dv: items of DKV_TILE = 128 keys, one 64-key half per compute warpgroup, holding dK and
  dV in registers over the block's run in chunks of 64 rows (128 below head_dim 128) (q and
  dO in sorted order - q's rows from the forward, dO's from dq - so a chunk is one box),
  longest items first; the key tiles a chunk attends whole skip the mask. With
  MobaBlockSizes.split_dkv_runs a tile's run longer than a CTA's share is split into parts
  summed afterwards (dkv_items).

The kernels carry no automatic warpgroup barriers (CompilerParams.unsafe_no_auto_barriers):
no thread reads shared memory its warpgroup also writes, and the ordering they need is
explicit. Their reductions stay within a wgmma tile's rows (a row's maximum or sum, within one
warp): one across rows (over a warpgroup's 64 rows, to a scalar) goes through a shared-memory
scratch that jax 0.11.2's Mosaic GPU lowering places at the same offset for every warpgroup, so
two compute warpgroups reducing at once race on it - wrong on the GPU, right in the
interpreter (BENCHMARKS.md, the forward's conditional rescaling). Their named regions
(jax.named_scope) are what hopper.profile_kernels records.

The package: `common` (what the kernels share: tile constants, checks, the persistent launch,
the turns and products on the tensor cores, sorted-row gathers), `streams` (the forward's
and dq's item list and their two streaming warpgroups: K/V tiles, the items' query rows),
`rows` (the forward and dq kernels on row items), `dkv` (dk/dv on key-tile items, with its
item plan).

bf16 only (wgmma's 16-bit path); float32 inputs stay on the Triton kernels. In interpret mode
(CPU tests) P and dS go through shared memory, the one wgmma operand form the interpreter
runs.
"""

from pallas_kernels.moba.hopper.common import (DKV_TILE, INTERPRET_MIN_HOST_DEVICES, ITEM_ROWS,
                                               check_device, check_supported, gather_rows,
                                               profile_kernels, sorted_rows)
from pallas_kernels.moba.hopper.dkv import (DkvItems, dkv_chunk_rows, dkv_chunk_steps, dkv_items,
                                            longest_first, moba_dkv)
from pallas_kernels.moba.hopper.rows import (dq_schedule, forward_schedule, moba_dq_rows,
                                             moba_forward_rows, RowSchedule)
from pallas_kernels.moba.hopper.streams import box_halves, persistent_items

__all__ = ["DKV_TILE", "INTERPRET_MIN_HOST_DEVICES", "ITEM_ROWS", "DkvItems", "RowSchedule",
           "box_halves", "check_device", "check_supported", "dkv_chunk_rows", "dkv_chunk_steps",
           "dkv_items", "dq_schedule", "forward_schedule", "gather_rows", "longest_first",
           "moba_dkv", "moba_dq_rows", "moba_forward_rows", "persistent_items", "profile_kernels",
           "sorted_rows"]
