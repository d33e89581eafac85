"""Real data parallelism for the straggler benchmark: every shard on its own device.

`MeshRunner` is the mesh counterpart of `simulate.DeviceRunner`: `simulate.run_workload` plans
and tunes the same way (same documents, batchers, tuner, coverage probe) and asks the runner to
measure each step. Here a step runs as the trainer runs it, over a data-only mesh of S devices
(one shard per device), with real collectives. What is measured, per step:

- A shard's time: the collective-free program of `training.step.ShardTimedStep` (each device
  computes its shard's loss and gradients over its micro-batches), timed by each device's own
  clock (`pallas_kernels/device_clock.py`; on CPU, when each device's outputs are ready as the
  host sees it, which says nothing about balance). One warm-up call, then the median of
  `repeats` calls, per shard. The gradients are dropped.
- The step's time: the trainer's fused step (`training.step.FusedStep`: one program per
  budget bucket, the gradients all-reduced once inside it, optimizer update; before f3ab18e
  once per micro-batch), wall time of a blocking
  call (the loss read back), one warm-up call, then the median of `repeats`.
- Parameters: every call starts from the initial train state (the fused step gets a fresh copy,
  which it donates), as the simulation's micro-batches do. Carried from step to step, the
  updates would change the gate's selections, and with them how the MoBA kernels' work spreads
  over the key blocks: a first two-GPU run that carried the state saw shard times drift up
  over the run where the simulation's stayed flat, which would confound rows run later.
- `modeled_step_seconds`: the slowest shard plus the modeled ring all-reduce at the benchmark's
  bus bandwidth, what the one-device simulation would call this step: the gap between it
  and `step_seconds` (the record's `runner_step_seconds`) is what the simulation leaves out
  (the all-reduce's real cost and overlap, the devices' skew in reaching the program).

Coverage for the tuner's floor comes from the initial parameters, as in the simulation.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from sparsebalance_jax.balance.simulate import BenchSetup, allreduce_seconds
from sparsebalance_jax.config import Config
from sparsebalance_jax.model import Transformer
from sparsebalance_jax.sharding import make_mesh
from sparsebalance_jax.sharding.distributed import global_batch
from sparsebalance_jax.training.launch import CoverageProbe
from sparsebalance_jax.training.state import create_train_state
from sparsebalance_jax.training.step import FusedStep, ShardTimedStep


class MeshRunner:
    """The model trained on a data-only mesh of `cfg.mesh.data` devices; see the module
    docstring for what `measure_step` reads. `compiles` counts every real compile (both
    programs of every bucket)."""

    def __init__(self, cfg: Config, seed: int, devices: list | None = None):
        """`devices`: the mesh's devices in shard order (default: the first `cfg.mesh.data`)."""
        m = cfg.mesh
        if m.fsdp * m.tensor != 1:
            raise ValueError(f"mesh: the benchmark times one shard per device and needs a "
                             f"data-only mesh, got data {m.data} x fsdp {m.fsdp} x tensor "
                             f"{m.tensor}")
        devices = jax.devices()[:m.data] if devices is None else list(devices)
        if len(devices) != m.data:
            raise ValueError(f"mesh.data={m.data} shards need as many devices; got "
                             f"{len(devices)} ({jax.device_count()} available)")
        self.mesh = make_mesh(m, devices)
        buckets = cfg.attention.budget_buckets
        model = Transformer(cfg.model, cfg.attention, buckets[-1])
        # Never donated: the fused step runs on copies of it.
        self.initial_state, shardings = create_train_state(cfg, self.mesh, model,
                                                           jax.random.key(seed))
        self.params = self.initial_state.params
        self.param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.params))
        self._timed = ShardTimedStep(cfg.model, cfg.attention, self.mesh, shardings, buckets)
        self._fused = FusedStep(cfg.model, cfg.attention, self.mesh, shardings, buckets)
        # As simulate.DeviceRunner's: the decision's probe and the report's, each device
        # probing its own shard (the parameters are on the mesh).
        self._coverage = {"decision": CoverageProbe(cfg, model),
                          "report": CoverageProbe(cfg, model, buckets[-1], query_stride=1)}

    @property
    def compiles(self) -> int:
        return self._timed.compiles + self._fused.compiles

    def shard_coverage(self, step_batch: dict[str, np.ndarray], use: str = "decision"
                       ) -> np.ndarray:
        """As simulate.DeviceRunner.shard_coverage."""
        return np.asarray(self._coverage[use](step_batch, self.params), np.float64)

    def decision_coverage(self, step_batch: dict[str, np.ndarray], repeats: int
                          ) -> tuple[np.ndarray, float]:
        """As simulate.DeviceRunner.decision_coverage, from one call on the mesh (every
        device probes its own shard); the charge is that call's synchronised wall time (the
        host's part included, which the loop's prefetch hides: an upper bound)."""
        seconds = self._coverage["decision"].device_seconds(step_batch, self.params,
                                                            repeats=repeats)
        return self.shard_coverage(step_batch), seconds

    def measure_step(self, step_batch: dict[str, np.ndarray], budgets_S: np.ndarray,
                     bucket: int, setup: BenchSetup, used: set) -> dict[str, Any]:
        S = setup.num_shards
        if S != self.mesh.shape["data"]:
            raise ValueError(f"{S} shards planned on a mesh of {self.mesh.shape['data']}")
        budgets = np.broadcast_to(np.asarray(budgets_S, np.int32)[:, None, None],
                                  step_batch["budgets"].shape)
        step_batch = dict(step_batch, budgets=budgets)
        used.add((bucket, tuple(step_batch["inputs"].shape)))
        timed_batch = global_batch(self._timed.batch_shardings, self._timed.layout(step_batch))
        shard_runs = []
        for call in range(1 + setup.repeats):
            seconds_S = self._timed.time_shards(bucket, self.params, timed_batch)
            if call > 0:
                if seconds_S is None:
                    raise AssertionError("the shard program ran untimed after its warm-up call "
                                         "(compiled anew)")
                shard_runs.append(seconds_S)
        fused_batch = global_batch(self._fused.batch_shardings, self._fused.layout(step_batch))
        step_runs, losses = [], []
        for call in range(1 + setup.repeats):
            state = jax.block_until_ready(jax.tree.map(lambda x: x.copy(), self.initial_state))
            start = time.perf_counter()
            _, metrics, _ = self._fused(bucket, state, fused_batch)
            loss = float(metrics["loss"])
            if call > 0:
                step_runs.append(time.perf_counter() - start)
            losses.append(loss)
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss {loss} in the benchmark's training step")
        measured_S = np.median(np.asarray(shard_runs), axis=0)
        allreduce = allreduce_seconds(self.param_bytes, S, setup.bus_bytes_per_s)
        return dict(measured_S=measured_S.tolist(),
                    shard_runs_RS=np.asarray(shard_runs).tolist(),
                    step_seconds=float(np.median(step_runs)), step_runs=step_runs,
                    step_losses=losses,
                    modeled_step_seconds=float(measured_S.max() + allreduce),
                    allreduce_seconds=allreduce)
