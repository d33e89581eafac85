"""A float32 atomic add with relaxed memory ordering for Pallas Triton kernels.

`jax.experimental.pallas.triton.atomic_add` lowers to `tt.atomic_rmw` with acquire-release
semantics: every element's add is ordered against the program's other memory accesses. A
kernel that only accumulates (each add commutes with the others and nothing reads the target
before the kernel ends) needs no ordering, and on the H200 the acquire-release form cost the
fused dq accumulation about 4x the dq kernel it replaced (BENCHMARKS.md, "Fused dq + dk/dv
kernel"). `relaxed_atomic_add` is the same operation with `relaxed` semantics, as CUDA's
`atomicAdd` and FlashAttention-2's dq accumulation use.

It is a primitive of its own (Pallas' atomic add's abstract evaluation; an interpret-mode
discharge that accumulates repeated indices and honours the mask) with its own Triton lowering
rule; it reaches into JAX internals
(jax._src), which the project's pinned JAX version fixes.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax._src import core as jax_core
from jax._src import tree_util
from jax._src.pallas.triton import lowering as tl
from jax._src.pallas.triton import primitives as tp
from jax._src.lib.triton import dialect as tt_dialect
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

relaxed_atomic_add_p = jax_core.Primitive("moba_relaxed_atomic_add")
relaxed_atomic_add_p.def_effectful_abstract_eval(tp._atomic_abstract_eval)


@state_discharge.register_discharge_rule(relaxed_atomic_add_p)
def _discharge(ctx, *args_flat, args_tree, atomic_type):
  """Interpret mode: ref.at[idx].add(val) (repeated indices accumulate), masked lanes add 0;
  returns the prior values, as the atomic does."""
  assert atomic_type == tp.AtomicOpType.ADD
  ref, transforms, val, mask = args_tree.unflatten(args_flat)
  if mask is not None:
    val = jnp.where(mask, val, jnp.zeros_like(val))
  old = state_discharge.transform_array(ref, transforms)
  flat, tree = tree_util.tree_flatten(transforms)
  new = state_discharge._addupdate_discharge(ref, val, flat, tree)
  return (new,) + (None,) * (len(ctx.in_avals) - 1), old


@tl.register_lowering(relaxed_atomic_add_p)
def _lowering(ctx, *args_flat, args_tree, atomic_type):
  assert atomic_type == tp.AtomicOpType.ADD
  block_info, *_ = ctx.block_infos
  ptr, indexers, val, mask = args_tree.unflatten(args_flat)
  *_, value_aval, mask_aval = args_tree.unflatten(ctx.avals_in)
  indexers = list(indexers)
  if not indexers or not isinstance(indexers[-1], indexing.NDIndexer):
    ref_aval = state_types.transform_type(indexers, ctx.avals_in[0])
    indexers.append(indexing.NDIndexer.make_trivial_indexer(ref_aval.shape))
  if len(indexers) != 1:
    raise NotImplementedError("relaxed_atomic_add takes one indexer")
  ptr = tl._compute_pointers_from_indices(ptr, block_info, indexers[0])
  val = tl._ensure_ir_value(val, value_aval)
  if mask is not None:  # broadcast to the value's shape, as the op requires
    mask = tl._bcast_to(tl._ensure_ir_value(mask, mask_aval),
                        indexers[0].get_indexer_shape())
  return tl._atomic_rmw(tt_dialect.RMWOp.FADD, ptr, val, mask=mask,
                        semantic=tt_dialect.MemSemantic.RELAXED)


def relaxed_atomic_add(x_ref, idx, val, *, mask=None) -> None:
  """`x_ref[idx] += val` elementwise, atomically, with no ordering (float32 refs)."""
  ref, transforms = state_primitives.get_ref_and_transforms(x_ref, idx, "relaxed_atomic_add")
  args_flat, args_tree = tree_util.tree_flatten((ref, transforms, val, mask))
  relaxed_atomic_add_p.bind(*args_flat, args_tree=args_tree, atomic_type=tp.AtomicOpType.ADD)
