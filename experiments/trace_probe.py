"""Where DST's coverage probe spends its time: `training.launch.CoverageProbe` on one step's
rows, timed and traced (GPU kernels and host events per call), at each query stride
(`balance.probe_stride`) asked for, with how far each stride's coverage curve lies from the
first stride's on the same rows.

    python -m experiments.trace_probe --config=configs/longbench.py:gpu --shards=8 \\
        --config.model.num_layers=4 --config.attention.block_size=512 \\
        --config.attention.budget=16 --config.attention.budget_buckets='(16,24)' --strides=1,8,16

The rows: --shards shards x data.micro_batches x data.rows_per_micro_batch rows of
data.seq_len random tokens, one document per row; the parameters: a fresh init.
"""

import time

from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.")
_SHARDS = flags.DEFINE_integer("shards", 8, "Data shards whose rows the probe reads.")
_CALLS = flags.DEFINE_integer("calls", 10, "Timed calls (median), then three traced.")
_STRIDES = flags.DEFINE_list("strides", ["8"], "balance.probe_stride values to time, in turn.")


def main(argv):
    del argv
    import tempfile

    import flax.linen as nn
    import jax
    import numpy as np

    from experiments.trace_moba import device_kernel_times, host_event_times, load_trace
    from sparsebalance_jax import config as config_lib
    from sparsebalance_jax.model import Transformer
    from sparsebalance_jax.training import launch
    from sparsebalance_jax.training.state import dummy_inputs

    if jax.default_backend() != "gpu":
        raise SystemExit("trace_probe needs a GPU: it reads the probe's GPU kernels from a "
                         f"profiler trace (this process has {jax.default_backend()} only)")
    raw = _CONFIG.value
    raw.mesh.data, raw.mesh.fsdp, raw.mesh.tensor = 1, 1, 1
    cfg = config_lib.from_config_dict(raw)
    model = Transformer(cfg.model, cfg.attention, cfg.attention.budget_buckets[-1])
    init_len = cfg.attention.budget_buckets[-1] * cfg.attention.block_size
    params = jax.jit(lambda r: nn.meta.unbox(model.init(r, *dummy_inputs(1, init_len))))(
        jax.random.key(0))["params"]
    d = cfg.data
    shape = (_SHARDS.value, d.micro_batches, d.rows_per_micro_batch, d.seq_len)
    rng = np.random.default_rng(0)
    batch = dict(inputs=rng.integers(0, cfg.model.vocab_size, shape).astype(np.int32),
                 segment_ids=np.ones(shape, np.int32),
                 positions=np.broadcast_to(np.arange(d.seq_len, dtype=np.int32), shape).copy())
    first_curve = None
    for stride in map(int, _STRIDES.value):
        raw.balance.probe_stride = stride
        cfg = config_lib.from_config_dict(raw)
        probe = launch.CoverageProbe(cfg, model)
        curve = np.asarray(probe(batch, params))  # compile
        first_curve = curve if first_curve is None else first_curve
        walls = []
        for _ in range(_CALLS.value):
            start = time.perf_counter()
            np.asarray(probe(batch, params))
            walls.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as log_dir:
            with jax.profiler.trace(log_dir):
                for _ in range(3):
                    np.asarray(probe(batch, params))
            trace = load_trace(log_dir)
        kernels, _ = device_kernel_times(trace)
        total = sum(us for us, _ in kernels.values()) / 3 / 1e3
        off = np.abs(curve - first_curve)
        print(f"{jax.devices()[0].device_kind}: probe of {np.prod(shape[:3])} rows x "
              f"{d.seq_len}, query stride {stride}: median {1e3 * np.median(walls):.2f} ms wall "
              f"({1e3 * min(walls):.2f} min); GPU kernels {total:.2f} ms per call; coverage "
              f"curve off stride {_STRIDES.value[0]}'s by at most {off.max():.4f} (mean "
              f"{off.mean():.4f}) over shards x budgets 1..{curve.shape[1]}")
        for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:8]:
            print(f"  {us / 3 / 1e3:8.3f} ms  x{n / 3:<4g} {name[:90]}")
        print("host events per call (ms, count):")
        for name, us, count in host_event_times(trace, 8):
            print(f"  {us / 3 / 1e3:8.3f} ms  x{count / 3:<4g} {name[:90]}")


if __name__ == "__main__":
    cli.run(main)
