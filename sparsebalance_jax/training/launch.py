"""From an ml_collections config to a running job: devices, typed config, data, balancer, loop."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from sparsebalance_jax.config import (Config, ConfigError, MeshConfig, check_attention_runs_here,
                                      from_config_dict)
from sparsebalance_jax.sharding import make_mesh
from sparsebalance_jax.sharding.distributed import maybe_initialize, spec_from_env
from sparsebalance_jax.training.budgets import DstBalancer, FixedBudgets
from sparsebalance_jax.training.loop import describe, train


def request_host_devices(raw) -> None:
    """On CPU, expose as many host devices as the config's mesh asks for, when every axis has a
    size; a mesh with a -1 axis (the devices left over) takes the host devices there are (one,
    unless XLA_FLAGS' --xla_force_host_platform_device_count sets more).

    Must run before JAX starts its backends; it has no effect on GPU devices. In a
    multi-process job (JAX_NUM_PROCESSES) each process holds its share of the mesh.
    """
    mesh = raw["mesh"]
    sizes = [mesh["data"], mesh["fsdp"], mesh["tensor"]]
    if any(s < 1 for s in sizes):
        return
    total = sizes[0] * sizes[1] * sizes[2]
    # The launch as maybe_initialize will read it (SPARSEBALANCE_DISTRIBUTED=off: one process).
    spec = spec_from_env(os.environ)
    processes = 1 if spec is None or spec.num_processes is None else spec.num_processes
    if total % processes:
        raise ConfigError(f"mesh: {total} devices do not split over JAX_NUM_PROCESSES="
                          f"{processes} processes")
    jax.config.update("jax_num_cpu_devices", total // processes)


def data_spec(cfg: Config):
    """The pipeline's DataSpec of `cfg.data`; a field it refuses, or an input file that is
    missing, is a ConfigError naming the `data.` field."""
    from sparsebalance_jax.data.pipeline import DataSpec, DataSpecError

    missing = [p for p in cfg.data.jsonl_paths if not os.path.isfile(p)]
    if missing:
        raise ConfigError(f"data.jsonl_paths: no such file: {', '.join(missing)}")
    names = {f.name for f in dataclasses.fields(DataSpec)}
    try:
        return DataSpec(**{k: v for k, v in dataclasses.asdict(cfg.data).items() if k in names})
    except DataSpecError as e:
        raise ConfigError(f"data.{e.field}: {e.message}") from None


def latency_model(cfg: Config):
    """The cost model the batcher and the tuner price work with (see balance/latency.py)."""
    from sparsebalance_jax.balance import latency
    from sparsebalance_jax.balance.tuner import budget_bounds

    shape = latency.LayerShape.from_configs(cfg.model, cfg.attention)
    try:
        model = latency.make_latency_model(cfg.balance.latency_model, shape,
                                           table_dir=cfg.balance.latency_table,
                                           device_kind=jax.devices()[0].device_kind)
    except FileNotFoundError as e:
        raise ConfigError(f"balance.latency_table: {e}") from None
    # Every price the run can ask for, asked once now: the longest document at the base budget
    # (the batcher's) and at every budget the tuner may choose. A table that cannot price them
    # stops the run here, before anything is written, not at its first batch.
    a = cfg.attention
    lo, hi = (budget_bounds(a.budget, cfg.balance.p, a.budget_buckets[-1]) if cfg.balance.dst
              else (a.budget, a.budget))
    try:
        model.predict_per_budget(np.array([[cfg.data.max_doc_len]]), np.arange(lo, hi + 1))
    except ValueError as e:
        raise ConfigError(f"balance.latency_table: {e}") from None
    return model


def data_iterator(cfg: Config, cost_model, crop_counter=None):
    """The training pipeline's iterator; documents cropped to data.max_doc_len are counted in
    `crop_counter` (a data.documents.CropCounter) where one is given."""
    from sparsebalance_jax.data.pipeline import train_iterator

    d = cfg.data
    return train_iterator(
        data_spec(cfg), d.seed, num_shards=cfg.num_data_shards, micro_batches=d.micro_batches,
        rows_per_micro_batch=d.rows_per_micro_batch, row_len=d.seq_len,
        block_size=cfg.attention.block_size, base_budget=cfg.attention.budget,
        batcher=d.batcher, shard_index=jax.process_index(), shard_count=jax.process_count(),
        window=d.window, cost_model=cost_model, crop_counter=crop_counter)


class CoverageProbe:
    """DST's coverage probe: `probe(step_batch, params)` -> float32 [S, k_max], each shard's
    first-layer gate coverage at every budget 1..k_max (column k - 1: budget k), from one device
    call (`moba_coverage_curve`), its rows weighted by their non-padding tokens; dispatched, not
    waited for (np.asarray waits). The queries are those of every `balance.probe_stride`-th
    token (`query_stride` overrides it). k_max defaults to the base budget, the largest the
    tuner's coverage floor weighs (it checks only cuts). The rows go where the parameters are:
    with parameters placed on a mesh (the step's, or with several processes this process's
    devices: `local_copies`), shard s's rows on its data shard s, as the step places them, so
    that every device probes its own shards at once; else on the parameters' device."""

    INPUTS = ("inputs", "segment_ids", "positions")  # the step batch's arrays it reads

    def __init__(self, cfg: Config, model, k_max: int | None = None,
                 query_stride: int | None = None):
        from pallas_kernels.moba import moba_coverage_curve
        from sparsebalance_jax.model import first_layer_qk

        a = cfg.attention
        k_max = k_max or a.budget
        stride = query_stride or cfg.balance.probe_stride

        def shards_coverage(params, ids_3SMRT):
            inputs_SMRT, segment_ids_SMRT, positions_SMRT = ids_3SMRT
            s, t = inputs_SMRT.shape[0], inputs_SMRT.shape[-1]
            rows = lambda x: x.reshape(-1, t)
            q, k = first_layer_qk(model, params, rows(inputs_SMRT), rows(positions_SMRT), stride)
            cov_NK = moba_coverage_curve(q, k, rows(segment_ids_SMRT), block_size=a.block_size,
                                         k_max=k_max, query_stride=stride)
            tokens_SN1 = (segment_ids_SMRT > 0).sum(-1).reshape(s, -1, 1).astype(jnp.float32)
            return ((cov_NK.reshape(s, -1, k_max) * tokens_SN1).sum(1)
                    / jnp.maximum(tokens_SN1.sum(1), 1))

        self._program = shards_coverage
        self._jitted = jax.jit(shards_coverage)
        self._clocked = None

    @staticmethod
    def _mesh(params):
        """The mesh the parameters are placed on, or None."""
        from jax.sharding import NamedSharding

        sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
        return sharding.mesh if isinstance(sharding, NamedSharding) else None

    def _ids(self, step_batch, params) -> jax.Array | np.ndarray:
        from jax.sharding import NamedSharding, PartitionSpec

        from sparsebalance_jax.sharding import BATCH_AXES

        # One host-to-device copy, not three: each costs the call a transfer's fixed part.
        ids_3SMRT = np.stack([step_batch[k] for k in self.INPUTS])
        mesh = self._mesh(params)
        if mesh is None:
            return ids_3SMRT
        return jax.device_put(ids_3SMRT, NamedSharding(mesh, PartitionSpec(None, BATCH_AXES)))

    def __call__(self, step_batch, params) -> jax.Array:
        return self._jitted(params, self._ids(step_batch, params))

    def device_seconds(self, step_batch, params, *, repeats: int = 5) -> float:
        """Median seconds the device spends on one probe of `step_batch` - what a step pays
        for a probe dispatched while the step before it runs (the loop's prefetch), the host's
        part hidden behind that step. On one GPU its own clock times the program
        (`balance.timing.time_on_device`); on a mesh or another backend the synchronised wall
        time, host part included."""
        from sparsebalance_jax.balance import timing

        ids = self._ids(step_batch, params)
        if jax.default_backend() == "gpu" and self._mesh(params) is None:
            if self._clocked is None:
                self._clocked = timing.clocked_call(self._program)
            return timing.time_on_device(self._clocked, params, ids, repeats=repeats)[1]
        return timing.time_call(self._jitted, params, ids, repeats=repeats)


def make_balancer(cfg: Config, cost_model):
    if cfg.balance.shard_timing and jax.process_count() > 1:
        raise ConfigError("balance.shard_timing: not supported with several processes yet (each "
                          "process sees only its own devices' times); set "
                          "--config.balance.shard_timing=False")
    if not cfg.balance.dst:
        return FixedBudgets(cfg.k_max)
    from sparsebalance_jax.model import Transformer

    model = Transformer(cfg.model, cfg.attention, cfg.attention.budget_buckets[-1])
    if jax.process_count() == 1:
        return DstBalancer(cfg, cost_model, CoverageProbe(cfg, model))
    # Several processes: each probes its own shards' rows with the copies of the (replicated)
    # parameters its devices hold - on a mesh of its local devices, each probing its own
    # shards - and the per-shard inputs of the decision are all-gathered.
    if cfg.mesh.fsdp * cfg.mesh.tensor != 1:
        raise ConfigError("balance.dst: with several processes it needs replicated parameters "
                          f"(mesh.fsdp = mesh.tensor = 1, got {cfg.mesh.fsdp} x "
                          f"{cfg.mesh.tensor}); set --config.balance.dst=False")
    from jax.experimental import multihost_utils

    probe = CoverageProbe(cfg, model)
    local_mesh = make_mesh(MeshConfig(jax.local_device_count(), 1, 1), jax.local_devices())
    return DstBalancer(cfg, cost_model,
                       lambda step_batch, params: probe(step_batch,
                                                        local_copies(params, local_mesh)),

                       gather=lambda x: np.asarray(multihost_utils.process_allgather(
                           np.asarray(x), tiled=True)),
                       first_shard=jax.process_index() * (cfg.num_data_shards
                                                          // jax.process_count()))


def local_copies(params, local_mesh):
    """Replicated parameters of a multi-process mesh as arrays replicated on `local_mesh`
    (this process's devices), built from the copies those devices already hold: no transfer."""
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(local_mesh, PartitionSpec())

    def one(x):
        by_device = {shard.device: shard.data for shard in x.addressable_shards}
        return jax.make_array_from_single_device_arrays(
            x.shape, replicated, [by_device[d] for d in local_mesh.devices.flat])
    return jax.tree.map(one, params)


def run(raw) -> dict:
    """Validates `raw` (a get_config() ConfigDict) against the devices, then trains."""
    maybe_initialize()  # Multi-process jobs join the coordinator before any backend starts.
    cfg = from_config_dict(raw, device_count=jax.device_count())
    check_attention_runs_here(cfg)
    print(describe(cfg), flush=True)
    cost_model = latency_model(cfg)
    from sparsebalance_jax.data.documents import CropCounter

    crops = CropCounter()
    return train(cfg, data_iterator(cfg, cost_model, crops), make_balancer(cfg, cost_model),
                 crop_counter=crops)
