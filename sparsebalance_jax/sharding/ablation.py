"""Mesh ablation: one config, several (data, fsdp, tensor) meshes, one table of step costs.

Each mesh is measured in a fresh process (spawned), so that its compile time is not helped by
an earlier mesh's caches, its peak memory is its own (backends only report a lifetime peak),
and an accelerator's memory is free again for the next mesh. Every mesh trains on the same
global batch: `rows_per_micro_batch x devices` rows per micro-batch, a count every mesh's
data x fsdp divides, so step times compare like with like. The step itself is the library's
(`create_train_state`, `compile_train_step`); nothing here re-implements it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import statistics
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from sparsebalance_jax.config import (Config, ConfigError, MeshConfig, check_attention_runs_here,
                                      from_config_dict)
from sparsebalance_jax.data.packing import ROW_KEYS, aligned_length, pack_rows
from sparsebalance_jax.jsonfile import write_json, write_text

# Tracing, lowering and XLA compilation: together, what a first call pays on top of running.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


@dataclasses.dataclass(frozen=True)
class MeshResult:
    mesh: str  # "DxFxT"
    backend: str
    device_kind: str
    compile_s: float
    step_time_s: float  # Median over the timed steps.
    step_times_s: tuple[float, ...]
    tokens_per_step: int
    tokens_per_s: float
    peak_bytes_per_device: int | None  # Max over devices; None when the backend reports none.
    first_loss: float  # Same batch and init on every mesh: these agree up to reduction order.


def parse_meshes(spec: str) -> tuple[MeshConfig, ...]:
    """'1x1x8,2x2x2' -> meshes (data x fsdp x tensor)."""
    meshes = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"--meshes: {item!r} is not DATAxFSDPxTENSOR with positive sizes "
                             f"(e.g. 2x2x2)")
        meshes.append(MeshConfig(*map(int, parts)))
    if not meshes:
        raise ConfigError("--meshes: no mesh given")
    return tuple(meshes)


def meshes_to_run(spec: str | None, raw: Mapping[str, Any]) -> tuple[MeshConfig, ...]:
    """The --meshes list, or else the config's own mesh (every axis given, no -1)."""
    if spec:
        return parse_meshes(spec)
    mesh = MeshConfig(**{k: raw["mesh"][k] for k in ("data", "fsdp", "tensor")})
    if min(mesh.shape) < 1:
        raise ConfigError(f"mesh: {mesh.shape} has a -1 axis; give the sizes, or --meshes")
    return (mesh,)


def mesh_name(mesh: MeshConfig) -> str:
    return "x".join(map(str, mesh.shape))


def _on_mesh(raw: Mapping[str, Any], mesh: MeshConfig) -> dict[str, Any]:
    # Every mesh is timed as one fused step: per-shard timing needs a data-only mesh.
    return dict(raw, mesh=dataclasses.asdict(mesh),
                balance=dict(raw["balance"], shard_timing=False))


def check_meshes(raw: Mapping[str, Any], meshes: Sequence[MeshConfig]) -> int:
    """Validates the config under every mesh before any runs; returns their device count."""
    sizes = {mesh_name(m): m.data * m.fsdp * m.tensor for m in meshes}
    if len(set(sizes.values())) != 1:
        raise ConfigError(f"meshes: every mesh must use the same number of devices, got {sizes}")
    for mesh in meshes:
        try:
            from_config_dict(_on_mesh(raw, mesh))
        except ConfigError as e:
            raise ConfigError(f"mesh {mesh_name(mesh)}: {e}") from None
    return next(iter(sizes.values()))


def synthetic_batch(cfg: Config, global_rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A step batch in the step layout ([M, G, T] rows), packed as training packs them
    (data.packing: documents at block starts, targets within each document, padding between):
    random-token documents of lengths drawn from [data.min_doc_len, data.max_doc_len], each
    row filled until its free slots run out (the last document cut to fit)."""
    rng = np.random.default_rng(seed)
    m, t, d, align = cfg.data.micro_batches, cfg.data.seq_len, cfg.data, cfg.attention.block_size
    rows = []
    for _ in range(m * global_rows):
        docs, free = [], t
        while free > 0:
            n = min(int(rng.integers(d.min_doc_len, d.max_doc_len + 1)), free)
            tokens = rng.integers(0, cfg.model.vocab_size, n + 1, dtype=np.int32)
            docs.append(dict(inputs=tokens[:-1], targets=tokens[1:],
                             loss_mask=np.ones(n, np.float32)))
            free -= aligned_length(n, align)
        rows.append(pack_rows(docs, 1, t, align))
    batch = {key: np.concatenate([r[key] for r in rows]).reshape(m, global_rows, t)
             for key in ROW_KEYS}
    return dict(batch, budgets=np.full((m, global_rows), cfg.attention.budget, np.int32))


class _CompileClock:
    """Sums JAX's compile-phase durations reported while it is installed."""

    def __init__(self):
        self.seconds = 0.0
        self._lock = threading.Lock()

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        del kwargs
        if event in COMPILE_EVENTS:
            with self._lock:
                self.seconds += duration


def build_step(raw: Mapping[str, Any], mesh: MeshConfig):
    """(state, compiled step, device batch, tokens per step) of the config on `mesh`, on a
    synthetic batch of packed random documents.

    Starts JAX itself: call it in a process whose backends have not started.
    """
    import jax

    size = mesh.data * mesh.fsdp * mesh.tensor
    jax.config.update("jax_num_cpu_devices", size)  # Host devices on CPU; ignored elsewhere.
    from sparsebalance_jax.model import Transformer
    from sparsebalance_jax.sharding.distributed import global_batch
    from sparsebalance_jax.sharding.mesh import make_mesh
    from sparsebalance_jax.training.state import create_train_state
    from sparsebalance_jax.training.step import batch_shardings, compile_train_step

    cfg = from_config_dict(_on_mesh(raw, mesh), device_count=jax.device_count())
    check_attention_runs_here(cfg)
    device_mesh = make_mesh(cfg.mesh)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    state, shardings = create_train_state(cfg, device_mesh, model, jax.random.key(cfg.train.seed))
    step = compile_train_step(model, device_mesh, shardings)
    host_batch = synthetic_batch(cfg, cfg.data.rows_per_micro_batch * size)
    batch = global_batch(batch_shardings(device_mesh), host_batch)
    return state, step, batch, int(np.prod(host_batch["inputs"].shape))


def measure_mesh(raw: Mapping[str, Any], mesh: MeshConfig, steps: int, warmup: int) -> MeshResult:
    """Builds state and step on `mesh` (build_step), runs `warmup` + `steps` steps, returns
    their costs. Starts JAX itself, as build_step."""
    import jax

    state, step, batch, tokens = build_step(raw, mesh)
    clock = _CompileClock()
    jax.monitoring.register_event_duration_secs_listener(clock)
    try:
        state, metrics = step(state, batch)
        first_loss = float(metrics["loss"])  # Blocks until the first step has run.
    finally:
        jax.monitoring.unregister_event_duration_listener(clock)
    for _ in range(warmup):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)

    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    median = statistics.median(times)
    return MeshResult(
        mesh=mesh_name(mesh), backend=jax.default_backend(),
        device_kind=jax.devices()[0].device_kind, compile_s=clock.seconds, step_time_s=median,
        step_times_s=tuple(times), tokens_per_step=tokens, tokens_per_s=tokens / median,
        peak_bytes_per_device=None if None in peaks else max(peaks), first_loss=first_loss)


def run_ablation(raw: Mapping[str, Any], meshes: Sequence[MeshConfig], *, steps: int,
                 warmup: int, progress=print) -> list[MeshResult]:
    """Validates every mesh first, then measures each in its own spawned process."""
    if steps < 1 or warmup < 0:
        raise ConfigError(f"--steps ({steps}) must be >= 1 and --warmup ({warmup}) >= 0")
    raw = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
    check_meshes(raw, meshes)
    results = []
    ctx = multiprocessing.get_context("spawn")  # A fork would inherit a started backend.
    for mesh in meshes:
        with ctx.Pool(1) as pool:
            result = pool.apply(measure_mesh, (raw, mesh, steps, warmup))
        progress(format_row(result))
        results.append(result)
    return results


def _memory(result: MeshResult) -> str:
    if result.peak_bytes_per_device is None:
        return "n/a"
    return f"{result.peak_bytes_per_device / 2**20:.1f}"


def format_row(r: MeshResult) -> str:
    return (f"| {r.mesh} | {r.step_time_s * 1e3:.1f} | {r.tokens_per_s:,.0f} | {_memory(r)} | "
            f"{r.compile_s:.2f} | {r.first_loss:.4f} |")


def to_markdown(results: Sequence[MeshResult], title: str) -> str:
    lines = [title, "",
             "| mesh (data x fsdp x tensor) | step time, median (ms) | tokens/s | "
             "peak memory per device (MiB) | compile (s) | loss, step 1 |",
             "|---|---:|---:|---:|---:|---:|"]
    return "\n".join(lines + [format_row(r) for r in results]) + "\n"


def write_results(out_dir: str, results: Sequence[MeshResult], meta: Mapping[str, Any],
                  title: str) -> tuple[str, str]:
    """Writes `meshes.md` and `meshes.json` under `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    md_path, json_path = os.path.join(out_dir, "meshes.md"), os.path.join(out_dir, "meshes.json")
    write_text(md_path, to_markdown(results, title))
    write_json(json_path, dict(meta, results=[dataclasses.asdict(r) for r in results]), indent=1)
    return md_path, json_path
