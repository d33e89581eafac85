"""Typed, frozen configuration: where an ml_collections config enters the library.

`from_config_dict` turns the `get_config()` ConfigDict of a file under `configs/` into a tree of
frozen dataclasses and validates every cross-field constraint up front, so a bad run fails at
start with a message naming the field instead of deep inside a jitted step.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import numpy as np

# The owning modules' tables of valid names: one list each, checked here at start.
from sparsebalance_jax.balance.tuner import ANCHORS
from sparsebalance_jax.data.batching import BATCHERS
from sparsebalance_jax.data.lengths import LENGTH_KINDS as LENGTH_DISTRIBUTIONS

ATTENTION_IMPLEMENTATIONS = ("reference", "cudnn", "moba")
MOBA_BACKENDS = ("triton", "mosaic")  # pallas_kernels.moba backend choices
DTYPES = ("float32", "bfloat16")
# What a rematerialised layer may keep for its backward pass (model.remat_keep): MoBA's attention
# results, the SwiGLU's gate and up projections.
REMAT_KEEP = ("attention", "mlp")


class ConfigError(ValueError):
    """A configuration value or combination is invalid; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float
    rms_eps: float
    param_dtype: str
    compute_dtype: str
    remat: bool
    remat_keep: tuple[str, ...]
    scan_layers: bool


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    implementation: str
    block_size: int
    budget: int
    budget_buckets: tuple[int, ...]
    layer_budget_scale: tuple[float, ...]
    interpret: bool
    moba_backend: str


@dataclasses.dataclass(frozen=True)
class DataConfig:
    seed: int
    seq_len: int
    rows_per_micro_batch: int
    micro_batches: int
    text_weight: float
    synthetic_weight: float
    jsonl_weight: float
    jsonl_paths: tuple[str, ...]
    synthetic_tasks: tuple[str, ...]
    length_distribution: str
    length_scale: float
    min_doc_len: int
    max_doc_len: int
    max_bad_lines: int
    tokenizer: str
    batcher: str
    window: int


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int
    fsdp: int
    tensor: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.tensor)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    b1: float
    b2: float
    eps: float
    grad_clip_norm: float


@dataclasses.dataclass(frozen=True)
class BalanceConfig:
    dst: bool
    anchor: str
    p: float
    coverage_floor: float
    probe_stride: int
    latency_model: str
    latency_table: str
    ema_decay: float
    dead_band: float
    raise_within_bucket: bool
    shard_timing: bool


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    num_steps: int
    seed: int
    workdir: str
    checkpoint_every: int
    checkpoint_keep: int
    log_every: int
    resume_with_changes: bool


@dataclasses.dataclass(frozen=True)
class Config:
    preset: str
    model: ModelConfig
    attention: AttentionConfig
    data: DataConfig
    mesh: MeshConfig
    optimizer: OptimizerConfig
    balance: BalanceConfig
    train: TrainConfig

    @property
    def num_data_shards(self) -> int:
        """Data-parallel shards: the batch axis is split over `data` x `fsdp`."""
        return self.mesh.data * self.mesh.fsdp

    @property
    def k_max(self) -> int:
        """Static budget bound of the base configuration: the smallest bucket holding the
        largest per-layer budget (the base budget times the largest layer scale)."""
        need = max_layer_budget(self.attention.budget, self.attention.layer_budget_scale)
        return min(b for b in self.attention.budget_buckets if b >= need)


# Fields a resumed run may change without train.resume_with_changes: they touch only how often the
# run logs and saves, where its directory is (another spelling of it, a moved run), what the
# backward pass recomputes (remat trades memory for time; the gradients are the same) and whether
# the layers run scanned or unrolled (the same parameters), not what it computes.
RESUMABLE_CHANGES = ("train.log_every", "train.checkpoint_every", "train.checkpoint_keep",
                     "train.resume_with_changes", "train.workdir", "model.remat",
                     "model.remat_keep", "model.scan_layers")


# Fields that shape the parameters (and the optimizer state): a checkpoint restores only into
# the same values, so not even train.resume_with_changes lets a change of them through.
PARAMETER_FIELDS = tuple(f"model.{f}" for f in ("vocab_size", "num_layers", "d_model",
                                                 "num_heads", "num_kv_heads", "head_dim",
                                                 "mlp_dim", "param_dtype"))


def config_changes(saved: Mapping[str, Any], cfg: Config) -> list[str]:
    """'field: saved -> now' for each field of `cfg` that differs from `saved` (a config as
    `config_record` wrote it), those in RESUMABLE_CHANGES left out."""
    def flat(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, Mapping):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    old, new = dict(flat(saved)), dict(flat(config_record(cfg)))
    return [f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k) and k not in RESUMABLE_CHANGES]


def config_record(cfg: Config) -> dict[str, Any]:
    """The config as plain JSON values (tuples as lists), as a work directory records it."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def max_layer_budget(budget: int, layer_budget_scale: tuple[float, ...]) -> int:
    """The largest budget any layer runs for a row budget: the model's rounding of budget x
    scale, in its float32 (a float64 product rounds differently at some halves: 45 x 0.7)."""
    scale = np.float32(max(layer_budget_scale, default=1.0))
    return max(1, int(np.round(np.float32(budget) * scale)))


def _section(cls, raw: Mapping[str, Any], name: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{name}: unknown field(s) {unknown}; known: {sorted(fields)}")
    missing = sorted(set(fields) - set(raw))
    if missing:
        raise ConfigError(f"{name}: missing field(s) {missing}")
    return cls(**{key: _typed(f"{name}.{key}", fields[key].type, value)
                  for key, value in raw.items()})


# A field's annotation (a string under `from __future__ import annotations`) -> the Python
# types its value may have; float fields also take ints, converted.
_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _typed(field: str, annotation: str, value: Any) -> Any:
    """value checked against the field's annotation: a wrong type fails here, naming the field,
    instead of deep in the run (a float budget bucket, a string learning rate)."""
    def scalar(kind: str, v: Any) -> Any:
        ok = isinstance(v, _SCALARS[kind]) and (kind == "bool" or not isinstance(v, bool))
        if not ok:
            raise ConfigError(f"{field}: expected {kind}, got {type(v).__name__} {v!r}")
        return float(v) if kind == "float" else v

    if annotation in _SCALARS:
        return scalar(annotation, value)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{field}: expected {annotation}, got {type(value).__name__} "
                              f"{value!r}")
        return tuple(scalar(annotation[len("tuple["):-len(", ...]")], v) for v in value)
    raise TypeError(f"{field}: no type check for the annotation {annotation!r}")


def _require(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{field}: {message}")


def _tokenizer_vocab(kind: str) -> int:
    from sparsebalance_jax.data.tokenizer import TOKENIZER_KINDS, make_tokenizer

    if kind not in TOKENIZER_KINDS:
        raise ConfigError(f"data.tokenizer: {kind!r} not in {TOKENIZER_KINDS}")
    return make_tokenizer(kind).vocab_size


def validate(cfg: Config, device_count: int | None = None) -> None:
    """Check every field and combination; raise ConfigError naming the field."""
    m, a, d, mesh = cfg.model, cfg.attention, cfg.data, cfg.mesh
    for field in ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim",
                  "mlp_dim", "rope_theta", "rms_eps"):
        _require(getattr(m, field) > 0, f"model.{field}", f"{getattr(m, field)} must be positive")
    _require(m.num_heads % m.num_kv_heads == 0, "model.num_heads",
             f"{m.num_heads} is not a multiple of model.num_kv_heads={m.num_kv_heads}")
    for field in ("param_dtype", "compute_dtype"):
        _require(getattr(m, field) in DTYPES, f"model.{field}",
                 f"{getattr(m, field)!r} not in {DTYPES}")
    for kept in m.remat_keep:
        _require(kept in REMAT_KEEP, "model.remat_keep", f"{kept!r} not in {REMAT_KEEP}")
    _require(len(set(m.remat_keep)) == len(m.remat_keep), "model.remat_keep",
             f"{m.remat_keep} names an entry twice")
    _require(a.implementation in ATTENTION_IMPLEMENTATIONS, "attention.implementation",
             f"unknown implementation {a.implementation!r}; choose one of "
             f"{ATTENTION_IMPLEMENTATIONS}")
    _require(a.moba_backend in MOBA_BACKENDS, "attention.moba_backend",
             f"unknown MoBA kernel set {a.moba_backend!r}; choose one of "
             f"{MOBA_BACKENDS}")
    if a.implementation == "moba":
        # The kernels' own rule, imported only when they are chosen.
        from pallas_kernels.moba.gating import check_head_dim
        try:
            check_head_dim(m.head_dim)
        except ValueError as e:
            raise ConfigError(f"model.head_dim: {m.head_dim} with attention.implementation="
                              f"'moba': {e}") from None
    if a.implementation == "moba" and a.moba_backend == "mosaic":
        # The kernels' own argument check, imported only when they are chosen.
        from pallas_kernels.moba import MobaBlockSizes, hopper
        try:
            hopper.check_supported(m.compute_dtype, m.head_dim, MobaBlockSizes(), a.block_size)
        except ValueError as e:
            raise ConfigError(f"attention.moba_backend: 'mosaic' with model.compute_dtype="
                              f"{m.compute_dtype!r}, model.head_dim={m.head_dim}, "
                              f"attention.block_size={a.block_size}: {e}") from None
    _require(a.block_size > 0, "attention.block_size", "must be positive")
    _require(d.seq_len > 0, "data.seq_len", f"{d.seq_len} must be positive")
    _require(d.seq_len % a.block_size == 0, "data.seq_len",
             f"{d.seq_len} is not a multiple of attention.block_size={a.block_size}")
    num_blocks = d.seq_len // a.block_size
    _require(1 <= a.budget <= num_blocks, "attention.budget",
             f"{a.budget} must be in [1, {num_blocks}] (the number of blocks, "
             f"data.seq_len // attention.block_size)")
    _require(len(a.budget_buckets) > 0 and list(a.budget_buckets) == sorted(set(a.budget_buckets)),
             "attention.budget_buckets", f"{a.budget_buckets} must be strictly increasing")
    _require(all(1 <= b <= num_blocks for b in a.budget_buckets), "attention.budget_buckets",
             f"{a.budget_buckets} must lie in [1, {num_blocks}] (the number of blocks)")
    _require(a.budget_buckets[-1] >= a.budget, "attention.budget_buckets",
             f"largest bucket {a.budget_buckets[-1]} is below attention.budget={a.budget}")
    _require(len(a.layer_budget_scale) in (0, m.num_layers), "attention.layer_budget_scale",
             f"needs 0 or model.num_layers={m.num_layers} entries, got {len(a.layer_budget_scale)}")
    _require(all(s > 0 for s in a.layer_budget_scale), "attention.layer_budget_scale",
             "entries must be positive")
    scaled = max_layer_budget(a.budget, a.layer_budget_scale)
    _require(scaled <= a.budget_buckets[-1], "attention.layer_budget_scale",
             f"budget {a.budget} x scale {max(a.layer_budget_scale, default=1.0)} = {scaled} "
             f"exceeds the largest bucket {a.budget_buckets[-1]}")
    _require(not (cfg.balance.dst and a.layer_budget_scale), "attention.layer_budget_scale",
             "per-layer budget scales are not priced by the DST latency model; set "
             "--config.balance.dst=False or leave the scales empty")
    tokens = _tokenizer_vocab(d.tokenizer)
    _require(m.vocab_size >= tokens, "model.vocab_size",
             f"{m.vocab_size} is smaller than the {d.tokenizer!r} tokenizer's {tokens} ids")
    _require(d.batcher in BATCHERS, "data.batcher", f"{d.batcher!r} not in {BATCHERS}")
    _require(d.length_distribution in LENGTH_DISTRIBUTIONS, "data.length_distribution",
             f"{d.length_distribution!r} not in {LENGTH_DISTRIBUTIONS}")
    # A document holds at least its BOS and EOS.
    _require(d.min_doc_len >= 2, "data.min_doc_len", f"{d.min_doc_len} must be >= 2")
    _require(d.min_doc_len <= d.max_doc_len <= d.seq_len, "data.max_doc_len",
             f"need data.min_doc_len ({d.min_doc_len}) <= data.max_doc_len "
             f"({d.max_doc_len}) <= data.seq_len ({d.seq_len})")
    for field in ("text_weight", "synthetic_weight", "jsonl_weight"):
        _require(getattr(d, field) >= 0, f"data.{field}", f"{getattr(d, field)} must be >= 0")
    _require(d.text_weight + d.synthetic_weight + d.jsonl_weight > 0, "data.text_weight",
             "source weights (text/synthetic/jsonl) are all zero")
    _require(d.jsonl_weight == 0 or len(d.jsonl_paths) > 0, "data.jsonl_paths",
             "data.jsonl_weight > 0 needs at least one path")
    _require(d.jsonl_weight > 0 or not d.jsonl_paths, "data.jsonl_weight",
             f"is 0, so data.jsonl_paths {d.jsonl_paths} would never be read; give the jsonl "
             f"source a weight > 0 or leave the paths empty")
    _require(d.seed >= 0, "data.seed", f"{d.seed} must be >= 0")
    _require(d.max_bad_lines >= 0, "data.max_bad_lines", f"{d.max_bad_lines} must be >= 0")
    _require(d.length_scale > 0, "data.length_scale", f"{d.length_scale} must be positive")
    for field in ("rows_per_micro_batch", "micro_batches"):
        _require(getattr(d, field) > 0, f"data.{field}", f"{getattr(d, field)} must be positive")
    _require(d.window >= 1, "data.window", "must be >= 1")
    for axis in ("data", "fsdp", "tensor"):
        size = getattr(mesh, axis)
        _require(size >= 1, f"mesh.{axis}",
                 "-1 (the devices the other axes leave) is resolved only given the device count "
                 "(from_config_dict(raw, device_count=...))" if size == -1 else
                 f"{size} must be >= 1, or -1 for the devices the other axes leave")
    if device_count is not None:
        size = mesh.data * mesh.fsdp * mesh.tensor
        _require(size == device_count, "mesh",
                 f"data x fsdp x tensor = {mesh.data}x{mesh.fsdp}x{mesh.tensor} = {size} does "
                 f"not match the {device_count} available devices")
    for field, size in (("num_kv_heads", m.num_kv_heads), ("num_heads", m.num_heads),
                        ("mlp_dim", m.mlp_dim), ("vocab_size", m.vocab_size)):
        _require(size % mesh.tensor == 0, "mesh.tensor",
                 f"{mesh.tensor} must divide model.{field}={size}")
    _require(m.d_model % mesh.fsdp == 0, "mesh.fsdp",
             f"{mesh.fsdp} must divide model.d_model={m.d_model}")
    _require(cfg.balance.anchor in ANCHORS, "balance.anchor",
             f"{cfg.balance.anchor!r} not in {ANCHORS}")
    _require(0.1 <= cfg.balance.p <= 0.3, "balance.p", f"{cfg.balance.p} must be in [0.1, 0.3]")
    _require(not cfg.balance.dst or a.implementation == "moba", "balance.dst",
             f"tunes MoBA budgets; attention.implementation={a.implementation!r} has none "
             f"(set --config.balance.dst=False)")
    _require(0.0 <= cfg.balance.coverage_floor <= 1.0, "balance.coverage_floor",
             "must be in [0, 1]")
    _require(1 <= cfg.balance.probe_stride <= a.block_size, "balance.probe_stride",
             f"{cfg.balance.probe_stride} must be in [1, attention.block_size={a.block_size}] "
             "(a stride past a block leaves blocks without a sampled query)")
    _require(cfg.balance.latency_model in ("analytic", "profiled"), "balance.latency_model",
             f"{cfg.balance.latency_model!r} not in ('analytic', 'profiled')")
    _require(0.0 <= cfg.balance.ema_decay < 1.0, "balance.ema_decay", "must be in [0, 1)")
    _require(0.0 <= cfg.balance.dead_band < 1.0, "balance.dead_band", "must be in [0, 1)")
    _require(not cfg.balance.shard_timing or mesh.fsdp * mesh.tensor == 1, "balance.shard_timing",
             f"times each data shard on its own device, so it needs mesh.fsdp = mesh.tensor = 1 "
             f"(got {mesh.fsdp} x {mesh.tensor}); set --config.balance.shard_timing=False")
    o = cfg.optimizer
    _require(0 < o.learning_rate < float("inf"), "optimizer.learning_rate",
             f"{o.learning_rate} must be positive and finite")
    _require(0.0 <= o.min_lr_ratio <= 1.0, "optimizer.min_lr_ratio",
             f"{o.min_lr_ratio} must be in [0, 1]")
    _require(o.weight_decay >= 0, "optimizer.weight_decay", f"{o.weight_decay} must be >= 0")
    for field in ("b1", "b2"):
        _require(0.0 <= getattr(o, field) < 1.0, f"optimizer.{field}",
                 f"{getattr(o, field)} must be in [0, 1)")
    _require(o.eps > 0, "optimizer.eps", f"{o.eps} must be positive")
    _require(0 < o.grad_clip_norm < float("inf"), "optimizer.grad_clip_norm",
             f"{o.grad_clip_norm} must be positive and finite (gradients are clipped to this "
             f"global norm)")
    t = cfg.train
    _require(t.num_steps > 0, "train.num_steps", "must be positive")
    _require(t.seed >= 0, "train.seed", f"{t.seed} must be >= 0")
    _require(bool(t.workdir.strip()), "train.workdir", "must name a directory")
    _require(t.log_every > 0, "train.log_every", "must be positive")
    # Warm-up may outlast a short run: the rate then ends below its peak.
    _require(cfg.optimizer.warmup_steps >= 0, "optimizer.warmup_steps",
             f"{cfg.optimizer.warmup_steps} must be >= 0")
    for field in ("checkpoint_every", "checkpoint_keep"):
        _require(getattr(t, field) > 0, f"train.{field}", f"{getattr(t, field)} must be positive")


def resolve_mesh(mesh: MeshConfig, device_count: int) -> MeshConfig:
    """Replace a single -1 axis by the devices left over by the others."""
    sizes = dict(data=mesh.data, fsdp=mesh.fsdp, tensor=mesh.tensor)
    free = [k for k, v in sizes.items() if v == -1]
    if len(free) > 1:
        raise ConfigError(f"mesh: at most one axis may be -1, got {free}")
    if free:
        fixed = 1
        for k, v in sizes.items():
            if v != -1:
                fixed *= v
        if fixed <= 0 or device_count % fixed:
            raise ConfigError(f"mesh.{free[0]}: -1 cannot be resolved, {device_count} devices "
                              f"are not a multiple of the other axes' product {fixed}")
        sizes[free[0]] = device_count // fixed
    return MeshConfig(**sizes)


def check_attention_runs_here(cfg: Config) -> None:
    """Raise ConfigError when the configured attention kernels cannot run on this process's
    devices (validate() checks the config alone, so that presets validate on any machine)."""
    import jax

    a = cfg.attention
    platform = jax.devices()[0].platform
    if a.implementation == "cudnn" and platform != "gpu":
        raise ConfigError(f"attention.implementation: 'cudnn' runs on NVIDIA GPUs, this process "
                          f"has {platform} devices; 'reference' is the same dense attention "
                          f"on any device")
    if a.implementation == "moba" and a.moba_backend == "mosaic":
        from pallas_kernels.moba import hopper
        try:
            hopper.check_device(a.interpret)
        except ValueError as e:
            raise ConfigError(f"attention.moba_backend: {e}") from None
    elif a.implementation == "moba" and not a.interpret and platform == "cpu":
        raise ConfigError("attention.interpret: False compiles the Pallas kernels, which needs "
                          "a GPU; this process has only CPU devices (set it to True)")


def from_config_dict(raw: Mapping[str, Any], device_count: int | None = None) -> Config:
    """ml_collections ConfigDict (or nested dict) -> validated frozen Config."""
    raw = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
    sections = dict(model=ModelConfig, attention=AttentionConfig, data=DataConfig,
                    mesh=MeshConfig, optimizer=OptimizerConfig, balance=BalanceConfig,
                    train=TrainConfig)
    unknown = sorted(set(raw) - set(sections) - {"preset"})
    if unknown:
        raise ConfigError(f"unknown top-level field(s) {unknown}")
    parts = {name: _section(cls, raw.get(name, {}), name) for name, cls in sections.items()}
    if device_count is not None:
        parts["mesh"] = resolve_mesh(parts["mesh"], device_count)
    cfg = Config(preset=raw.get("preset", "custom"), **parts)
    validate(cfg, device_count)
    return cfg

