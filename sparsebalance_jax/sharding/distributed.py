"""Multi-process start-up and host-local to global batches.

Owns the one call to `jax.distributed.initialize` a process makes, decided from the
environment before any backend starts:

- `JAX_COORDINATOR_ADDRESS` (host:port of process 0), `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`:
  an explicit multi-process job; all three are required together.
- `SPARSEBALANCE_DISTRIBUTED=auto`: let JAX detect the cluster (SLURM, Open MPI, Kubernetes,
  Cloud TPU) and fill in whatever of the three variables above is unset.
- none of these: a single process; nothing is initialised.

In a multi-process job every process runs the same program on its own devices. The data
pipeline hands each process only its own data shards, so the step batch a process holds is
its slice of the global batch; `global_batch` assembles the global `jax.Array`s the jitted
step takes from those host-local pieces.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import jax
import numpy as np

from sparsebalance_jax.config import ConfigError

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_MODE = "SPARSEBALANCE_DISTRIBUTED"
MODES = ("auto", "off")


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
    """What to pass to `jax.distributed.initialize`; None fields are left to cluster detection."""

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    auto_detect: bool


def _int_var(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def spec_from_env(environ: Mapping[str, str]) -> DistributedSpec | None:
    """The multi-process set-up the environment asks for, or None for a single process; a bad
    or incomplete set of variables is a ConfigError naming them (the commands print it alone)."""
    mode = environ.get(ENV_MODE, "").lower() or None
    if mode is not None and mode not in MODES:
        raise ConfigError(f"{ENV_MODE}={environ[ENV_MODE]!r}: expected one of {MODES}")
    coordinator = environ.get(ENV_COORDINATOR) or None
    num_processes = _int_var(environ, ENV_NUM_PROCESSES)
    process_id = _int_var(environ, ENV_PROCESS_ID)
    given = {ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: num_processes,
             ENV_PROCESS_ID: process_id}
    if mode == "off":
        return None
    if mode == "auto":
        return DistributedSpec(coordinator, num_processes, process_id, auto_detect=True)
    if all(v is None for v in given.values()):
        return None
    missing = [name for name, v in given.items() if v is None]
    if missing:
        raise ConfigError(f"multi-process launch: {missing} unset while "
                         f"{[n for n, v in given.items() if v is not None]} are set; set all "
                         f"three, or {ENV_MODE}=auto to let JAX detect the cluster")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ConfigError(f"{ENV_PROCESS_ID}={process_id} must lie in [0, "
                         f"{ENV_NUM_PROCESSES}={num_processes})")
    return DistributedSpec(coordinator, num_processes, process_id, auto_detect=False)


def maybe_initialize(environ: Mapping[str, str] | None = None) -> bool:
    """Initialises the JAX distributed runtime once if the environment asks for it.

    Returns True when this process is part of a multi-process job (initialised now or
    before). Must run before anything touches a backend (`jax.devices()`, a computation);
    JAX raises if a backend has already started.
    """
    if jax.distributed.is_initialized():
        return True
    spec = spec_from_env(os.environ if environ is None else environ)
    if spec is None:
        return False
    jax.distributed.initialize(
        coordinator_address=spec.coordinator_address, num_processes=spec.num_processes,
        process_id=spec.process_id,
        # An explicit spec must not be overridden by a cluster found in the environment.
        cluster_detection_method=None if spec.auto_detect else "deactivate")
    return True


def global_batch(shardings: Mapping[str, jax.sharding.Sharding],
                 local_batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """Host-local batch pieces -> global arrays laid out by `shardings`.

    Each process passes the rows its own devices hold (in device order); with one process
    this is a plain `device_put` of the whole batch.
    """
    return {key: jax.make_array_from_process_local_data(shardings[key], np.asarray(value))
            for key, value in local_batch.items()}
