"""The pure train step: gradient accumulation over micro-batches, token-weighted loss.

A step batch holds `[M, B, T]` arrays (micro-batches, global rows, tokens) and per-row budgets
`[M, B]`; rows are split over data x fsdp, so shard s owns rows [s*R, (s+1)*R). The loss is the
mean over every trained token of the whole step, so any mesh gives the same loss and gradients.
With several data shards each sums its own gradients over the micro-batches and they are
all-reduced over `data` once per step (`_data_parallel_grads`); XLA's SPMD partitioning places
the collectives over fsdp and tensor.

The shard-timed step (`ShardTimedStep`) is the same update in two programs, so that each data
shard's own compute can be timed: under one SPMD program every device waits at the gradient
all-reduce, and the step's time is the slowest shard's for all of them. Program 1 runs inside
`shard_map` over the data axis and has no collective: each device computes its shard's summed
loss, token count and gradients from its own rows (pipeline layout `[S, M, R, T]`). How a
shard's time is read:

* GPU: the device's own clock (`pallas_kernels/device_clock.py`), read at the start of the
  shard's program (before anything that uses the batch or the parameters, through an
  optimization barrier) and at its end (after every output). Timing from the host's dispatch
  instead read the second of two H200s ~13 ms late at every budget (BENCHMARKS.md): that
  counts when the program reached each device, not the device's work.
* Other backends (CPU tests): a thread per device records when that device's outputs are
  ready, counted from the dispatch.

Program 2 sums the shards' gradients (the all-reduce) and applies the update. It needs a
data-only mesh (fsdp = tensor = 1): with parameters or heads split, a shard's work is not one
device's. The cost: one un-reduced gradient per device is held between the programs (the
one-program step holds it too, inside its program), and a second dispatch; on two H200s the
two steps took the same time (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pallas_kernels import device_clock
from sparsebalance_jax.balance.compile_cache import CompileCache
from sparsebalance_jax.model import Transformer, token_losses
from sparsebalance_jax.sharding import AXES, BATCH_AXES, LOGICAL_RULES, rules_without

BATCH_KEYS = ("inputs", "targets", "loss_mask", "segment_ids", "positions", "budgets")


def loss_and_grads(model: Transformer, params, batch):
    """Summed loss, trained-token count and summed gradients over the micro-batches."""

    def micro(carry, mb):
        grads_acc, loss_acc, count_acc = carry

        def loss_fn(p):
            logits_BTV = model.apply({"params": p}, mb["inputs"], mb["segment_ids"],
                                     mb["positions"], mb["budgets"])
            return token_losses(logits_BTV, mb["targets"], mb["loss_mask"])

        (loss_sum, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
        return (grads_acc, loss_acc + loss_sum, count_acc + count), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, loss_sum, count), _ = jax.lax.scan(
        micro, (zeros, jnp.float32(0), jnp.float32(0)), {k: batch[k] for k in BATCH_KEYS})
    return loss_sum, count, grads


def _manual_loss_and_grads(model: Transformer, params, batch, *, manual: frozenset[str]):
    """loss_and_grads inside a shard_map over the `manual` mesh axes: the model's logical
    rules less those axes (the arrays here are already split over them)."""
    with nn.logical_axis_rules(rules_without(manual)):
        return loss_and_grads(model, params, batch)


def data_parallel(mesh: Mesh | None) -> bool:
    """Whether the step all-reduces the gradients over `data` once, after the micro-batches
    (_data_parallel_grads): with more than one data shard, unless fsdp and tensor are both
    split too. There XLA's SPMD partitioner (jax 0.11.2) aborts on the embedding's and the
    loss's gathers inside a shard_map over `data` alone (a failed check in
    spmd_partitioner_util.cc when it all-gathers over the two axes left), so such meshes keep
    plain SPMD partitioning."""
    return (mesh is not None and mesh.shape["data"] > 1
            and min(mesh.shape["fsdp"], mesh.shape["tensor"]) == 1)


def _data_parallel_grads(model: Transformer, mesh: Mesh, params, batch):
    """loss_and_grads with one all-reduce over `data` per step (step layout [M, B, T]): each
    data shard sums its own rows' loss, token count and gradients over the micro-batches with
    no collective over `data`, then one psum. Under plain SPMD partitioning XLA all-reduces the
    gradients inside the micro-batch loop instead (inside the layer scan, on meshes with fsdp
    or tensor > 1), once per micro-batch (the loop carries them replicated over `data`): M
    times the traffic, and 2.9% slower a step on two H200s with the GPU preset (BENCHMARKS.md).

    On a data-only mesh every axis is manual (each device's arrays are its own). Otherwise only
    `data` is: inside, XLA still partitions over fsdp and tensor (parameter all-gathers and
    gradient reduce-scatters over fsdp, activation all-reduces over tensor), with the logical
    rules less `data` (rules_without)."""
    manual = frozenset(AXES if mesh.shape["fsdp"] * mesh.shape["tensor"] == 1 else ["data"])

    def local(params, batch):
        return lax.psum(_manual_loss_and_grads(model, params, batch, manual=manual), "data")

    rows = {k: P(None, "data") for k in BATCH_KEYS}
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), rows), out_specs=P(),
                         axis_names=manual, check_vma=False)(
        params, {k: batch[k] for k in BATCH_KEYS})


def train_step(state, batch, *, model: Transformer, mesh: Mesh | None = None):
    """One update from a step batch (step layout); with several data shards, with one gradient
    all-reduce over `data` per step (_data_parallel_grads)."""
    if data_parallel(mesh):
        loss_sum, count, grads = _data_parallel_grads(model, mesh, state.params, batch)
    else:
        loss_sum, count, grads = loss_and_grads(model, state.params, batch)
    return apply_summed_grads(state, loss_sum, count, grads)


def apply_summed_grads(state, loss_sum, count, grads):
    """The update from gradients summed over every trained token of the step."""
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    new_state = state.apply_gradients(grads=grads)
    metrics = dict(loss=loss_sum / denom, tokens=count, grad_norm=optax.tree.norm(grads))
    return new_state, metrics


def batch_shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    rows = NamedSharding(mesh, P(None, BATCH_AXES, None))
    return {k: (NamedSharding(mesh, P(None, BATCH_AXES)) if k == "budgets" else rows)
            for k in BATCH_KEYS}


def mesh_context(mesh: Mesh):
    """The context a step is traced in: the mesh and the logical axis rules."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(LOGICAL_RULES))
    return stack


def jit_train_step(model_cfg, attention_cfg, state_shardings, mesh: Mesh | None = None):
    """The jitted step with the state donated; `k_max`, the budget bucket, is its one static
    argument (one compiled program per bucket). Inputs arrive placed: the state as
    `create_train_state` made it, the batch with `batch_shardings(mesh)` (jax.jit takes no
    in_shardings with a keyword argument); outputs keep the state's shardings. `mesh`: the
    mesh the step runs on (train_step's one all-reduce over `data` needs it)."""

    def step(state, batch, *, k_max: int):
        return train_step(state, batch, model=Transformer(model_cfg, attention_cfg, k_max),
                          mesh=mesh)

    return jax.jit(step, out_shardings=(state_shardings, None), donate_argnames="state",
                   static_argnames="k_max")


def compile_train_step(model: Transformer, mesh: Mesh, state_shardings):
    """`run(state, batch)` for one fixed model (its k_max), traced under the mesh."""
    jitted = jit_train_step(model.model, model.attention, state_shardings, mesh)

    def run(state, batch):
        with mesh_context(mesh):
            return jitted(state, batch, k_max=model.k_max)

    return run


def shard_batch_shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    """Pipeline layout [S, M, R, ...]: shard s's rows on data-shard s."""
    return {k: NamedSharding(mesh, P(BATCH_AXES)) for k in BATCH_KEYS}


def _per_shard_grads(params, batch_1MRT, *, model: Transformer):
    loss, count, grads = _manual_loss_and_grads(model, params,
                                                {k: v[0] for k, v in batch_1MRT.items()},
                                                manual=frozenset(AXES))
    return loss[None], count[None], jax.tree.map(lambda g: g[None], grads)


def _clocked_shard_grads(params, batch_1MRT, *, model: Transformer):
    """_per_shard_grads plus the device clock read before and after it: [1, 2, 16]."""
    (loss, count, grads), clock_2L = device_clock.clocked(
        functools.partial(_per_shard_grads, model=model))(params, batch_1MRT)
    return loss, count, grads, clock_2L[None]


def _ready_seconds(arrays_S: list[jax.Array], start: float) -> list[float]:
    """Seconds from `start` until each device's piece of the outputs is ready, one waiting
    thread per device, so one device's wait never delays another's reading."""
    by_device: dict = {}
    for arr in arrays_S:
        for shard in arr.addressable_shards:
            by_device.setdefault(shard.index[0].start or 0, []).append(shard.data)
    seconds = {}

    def wait(s, pieces):
        for piece in pieces:
            piece.block_until_ready()
        seconds[s] = time.perf_counter() - start

    threads = [threading.Thread(target=wait, args=(s, p)) for s, p in by_device.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [seconds[s] for s in sorted(seconds)]


class ShardTimedStep:
    """`step(bucket, state, batch_SMRT) -> (state, metrics, shard_seconds [S] or None)`; see the
    module docstring. Program 1 is compiled once per budget bucket (`CompileCache`), program 2
    once. The first run of a freshly compiled program is not timed (None): it reads far above
    the steady state (90 vs 58-71 ms on two H200s) and would mislead the EMA for many steps."""

    def __init__(self, model_cfg, attention_cfg, mesh: Mesh, state_shardings, buckets):
        if mesh.shape["fsdp"] * mesh.shape["tensor"] != 1:
            raise ValueError(f"per-shard timing needs a data-only mesh, got {dict(mesh.shape)}")
        self._mesh = mesh
        self.device_clock = jax.default_backend() == "gpu"
        shard_fn = _clocked_shard_grads if self.device_clock else _per_shard_grads

        def local(params, batch, *, k_max: int):
            model = Transformer(model_cfg, attention_cfg, k_max)
            return jax.shard_map(functools.partial(shard_fn, model=model), mesh=mesh,
                                 in_specs=(P(), P(BATCH_AXES)), out_specs=P(BATCH_AXES),
                                 check_vma=False)(params, batch)

        def update(state, loss_S, count_S, grads_S):
            return apply_summed_grads(state, loss_S.sum(), count_S.sum(),
                                      jax.tree.map(lambda g: g.sum(0), grads_S))

        self.local = CompileCache(jax.jit(local, static_argnames="k_max"), buckets)
        self._ran: set[int] = set()  # ids of program 1's executables run once (held by the cache)
        self._update = jax.jit(update, out_shardings=(state_shardings, None),
                               donate_argnames="state")
        self.batch_shardings = shard_batch_shardings(mesh)

    @staticmethod
    def layout(step_batch: dict) -> dict:
        """The pipeline layout [S, M, R, T] as it is, without the batcher's bookkeeping keys."""
        return {k: step_batch[k] for k in BATCH_KEYS}

    @property
    def compiles(self) -> int:
        return self.local.compiles

    def prepare(self, bucket: int, state, batch) -> float:
        """Compiles program 1 for this bucket and batch if it is not yet: seconds spent (0.0
        when compiled already), so the loop can time the step without it. Program 2, the
        update, small and compiled once, still compiles inside the first call."""
        with mesh_context(self._mesh):
            return self.local.prepare(bucket, state.params, batch)

    def _run_local(self, bucket: int, params, batch):
        """Program 1 dispatched: (loss_S, count_S, grads_S, seconds), where `seconds()` reads
        each shard's compute seconds [S] (None on the first run of a freshly compiled program,
        whether this call or `prepare` compiled it)."""
        local = self.local.compiled(bucket, params, batch)  # compiling is not timed
        if id(local) not in self._ran:
            self._ran.add(id(local))
            # Waited for: on a host-timed backend the next, timed call would otherwise start
            # its clock while this one still runs.
            return (*jax.block_until_ready(local(params, batch)[:3]), lambda: None)
        start = time.perf_counter()
        if self.device_clock:
            loss_S, count_S, grads_S, clock_S2L = local(params, batch)

            def seconds():
                clock = np.asarray(clock_S2L)
                # The host's wall time from dispatch bounds each device's: it resolves the
                # clock's 2^32 ns wrap for shard programs longer than 4.3 s.
                return device_clock.elapsed_seconds(
                    clock[:, 0], clock[:, 1], at_most_seconds=time.perf_counter() - start)
            return loss_S, count_S, grads_S, seconds
        loss_S, count_S, grads_S = local(params, batch)
        host = np.asarray(_ready_seconds([loss_S, count_S, *jax.tree.leaves(grads_S)], start))
        return loss_S, count_S, grads_S, lambda: host

    def __call__(self, bucket: int, state, batch):
        with mesh_context(self._mesh):
            loss_S, count_S, grads_S, seconds = self._run_local(bucket, state.params, batch)
            state, metrics = self._update(state, loss_S, count_S, grads_S)
        return state, metrics, seconds()

    def time_shards(self, bucket: int, params, batch) -> np.ndarray | None:
        """Program 1 alone (the gradients are computed and dropped): each shard's compute
        seconds [S], None on the first run of a freshly compiled program (`_run_local`)."""
        with mesh_context(self._mesh):
            *_, seconds = self._run_local(bucket, params, batch)
        return seconds()


def to_step_layout(step_batch: dict) -> dict:
    """Pipeline layout [S, M, R, T] (budgets [S, M, R]) -> step layout [M, S*R, T] ([M, S*R])."""
    out = {}
    for key in BATCH_KEYS:
        x = step_batch[key]
        x = x.swapaxes(0, 1)  # [M, S, R, ...]
        out[key] = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
    return out


class FusedStep:
    """The loop's step: `step(bucket, state, batch) -> (state, metrics, None)`, one program per
    budget bucket (`CompileCache`). `layout` turns a pipeline step batch into the step layout,
    `batch_shardings` places it. `ShardTimedStep` has the same interface."""

    def __init__(self, model_cfg, attention_cfg, mesh: Mesh, state_shardings, buckets):
        self._mesh = mesh
        self._cache = CompileCache(
            jit_train_step(model_cfg, attention_cfg, state_shardings, mesh), buckets)
        self.batch_shardings = batch_shardings(mesh)

    layout = staticmethod(to_step_layout)

    @property
    def compiles(self) -> int:
        return self._cache.compiles

    def prepare(self, bucket: int, state, batch) -> float:
        """Compiles the step for this bucket and batch if it is not yet: seconds spent (0.0
        when compiled already), so the loop can time the step without it."""
        with mesh_context(self._mesh):
            return self._cache.prepare(bucket, state, batch)

    def __call__(self, bucket: int, state, batch):
        with mesh_context(self._mesh):
            state, metrics = self._cache(bucket, state, batch)
        return state, metrics, None
