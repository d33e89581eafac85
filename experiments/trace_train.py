"""Where the main job's train step spends its GPU time: one config's step (the mesh ablation's
synthetic batch of packed documents) traced for a few steps, its kernels summed by kind.

    python -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 --steps=3 \\
        --out=$OUT/train_trace.json

The mesh is --meshes (one, data x fsdp x tensor), or else the config's own when every axis
is given.

Host events (the profiler's host threads, per step) show where the host waits, e.g. on a while
loop's condition (XLA's GPU runtime reads it back each trip).

Kinds: the MoBA Pallas kernels (forward, dq, dk/dv, the gate; `moba_*`), cuBLAS/cuDNN matmuls
and attention, NCCL collectives, and every other XLA kernel (fusions: norms, RoPE, the MoBA
gating's layout and merges, the loss, the optimizer). GPU only: the kernel times come from the
profiler's GPU timeline.
"""

import json

from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.",
                                          lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 3, "Traced steps (each synchronised).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after the first (compiling) one.")
_TOP = flags.DEFINE_integer("top", 20, "Kernels listed by GPU time.")
_MESHES = flags.DEFINE_string("meshes", None, "One DATAxFSDPxTENSOR mesh (the mesh ablation's "
                               "flag); default: the config's mesh.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the full result.")


def main(argv):
    del argv
    import tempfile
    import time

    import jax

    from experiments.trace_moba import (device_kernel_times, host_event_times, kernel_group,
                                        load_trace, step_spans)
    from sparsebalance_jax.config import ConfigError
    from sparsebalance_jax.sharding import ablation

    raw = _CONFIG.value
    meshes = ablation.meshes_to_run(_MESHES.value, raw)
    if len(meshes) != 1:
        raise ConfigError(f"--meshes: one mesh, got {_MESHES.value!r}")
    [mesh] = meshes
    state, step, batch, tokens = ablation.build_step(raw, mesh)
    for _ in range(1 + _WARMUP.value):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    walls = []
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir):
            for _ in range(_STEPS.value):
                start = time.perf_counter()
                state, metrics = step(state, batch)
                jax.block_until_ready(metrics)
                walls.append(time.perf_counter() - start)
        trace = load_trace(log_dir)
    kernels, _ = device_kernel_times(trace)  # raises without a GPU timeline
    span_us, idle_us = step_spans(trace, _STEPS.value)
    per_step = {name: us / _STEPS.value / 1e3 for name, (us, _) in kernels.items()}
    calls = {name: n / _STEPS.value for name, (_, n) in kernels.items()}
    by_kind: dict[str, float] = {}
    for name, ms in per_step.items():
        by_kind[kernel_group(name)] = by_kind.get(kernel_group(name), 0.0) + ms
    total = sum(per_step.values())
    result = dict(device=jax.devices()[0].device_kind, mesh=ablation.mesh_name(mesh),
                  tokens_per_step=tokens, wall_ms=[1e3 * w for w in walls],
                  span_ms=span_us / 1e3, idle_ms=idle_us / 1e3, kernel_ms=total,
                  by_kind_ms=by_kind, kernels_ms=dict(sorted(per_step.items(),
                                                              key=lambda kv: -kv[1])),
                  calls_per_step=calls,
                  host_events_ms_per_step=[(n, us / _STEPS.value / 1e3, c / _STEPS.value)
                                           for n, us, c in host_event_times(trace, 30)])
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{result['device']}, mesh {result['mesh']}, {tokens:,} tokens per step: wall "
          + ", ".join(f"{w:.1f}" for w in result["wall_ms"]) + f" ms; GPU span {span_us / 1e3:.1f}"
          f" ms, idle {idle_us / 1e3:.1f}; kernels {total:.1f} ms per step")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:15s} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
    for name, ms in list(result["kernels_ms"].items())[:_TOP.value]:
        print(f"  {ms:8.2f} ms  x{calls[name]:<5g} {kernel_group(name):15s} {name[:80]}")
    print("host events per step (ms, count; a while loop's thunk waits on the GPU):")
    for name, ms, count in result["host_events_ms_per_step"]:
        print(f"  {ms:8.2f} ms  x{count:<5g} {name[:80]}")


if __name__ == "__main__":
    cli.run(main)
