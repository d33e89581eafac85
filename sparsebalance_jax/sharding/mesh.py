"""The device mesh and the one table that maps the model's logical axis names to mesh axes.

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism whose parameters and
optimizer state are sharded too), `tensor` (attention heads and MLP columns split). The batch
is split over `data` x `fsdp`; every data shard runs its own MoBA budget.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from sparsebalance_jax.config import MeshConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical name -> mesh axis. Parameter names are plain; activation names start with `act_`.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("layers", None),
    ("act_batch", BATCH_AXES),
    ("act_seq", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def rules_without(manual) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """LOGICAL_RULES inside a shard_map whose `manual` axes are already split: those axes
    dropped from every rule (a constraint may name only the axes left to partition)."""
    out = []
    for name, axes in LOGICAL_RULES:
        kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ())
                     if a not in manual)
        out.append((name, kept[0] if len(kept) == 1 else (kept or None)))
    return tuple(out)


def make_mesh(cfg: MeshConfig, devices: list | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all), sizes from the config."""
    devices = jax.devices() if devices is None else devices
    size = cfg.data * cfg.fsdp * cfg.tensor
    if size != len(devices):
        raise ValueError(f"mesh: data x fsdp x tensor = {cfg.data}x{cfg.fsdp}x{cfg.tensor} = "
                         f"{size} does not match the {len(devices)} available devices")
    return Mesh(np.asarray(devices).reshape(cfg.shape), AXES)
