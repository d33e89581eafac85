"""Profile one decoder layer's fwd+bwd time over (document length x budget) on this device.

    python -m experiments.profile_latency --config=configs/longbench.py [--lengths=...]

Writes the latency table for this device kind and the config's layer shape into the config's
`balance.latency_table` folder (or --out_dir), where the profiled latency model finds it.
Defaults: lengths = block multiples doubling from one block up to data.seq_len, budgets =
1..largest bucket in up to 8 steps. On CPU use few sizes, up to the CPU preset's 1024-token
rows (a table must price the longest document the run packs), e.g.
    python -m experiments.profile_latency --config=configs/longbench.py:cpu \
        --lengths=256,1024 --budgets=1,4,8 --repeats=2 --out_dir=/tmp/tables
"""

import numpy as np
from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.")
_OUT = flags.DEFINE_string("out_dir", None, "Tables folder (default: balance.latency_table).")
_LENGTHS = flags.DEFINE_list("lengths", None, "Document lengths in tokens (block multiples).")
_BUDGETS = flags.DEFINE_list("budgets", None, "Budgets k to profile.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per point (median reported).")


def main(argv):
    del argv
    from sparsebalance_jax import config as config_lib
    from sparsebalance_jax.balance import latency, profiling

    # One layer on one device, whatever mesh the config trains on (the gpu preset's takes
    # every device, -1, which only a training run resolves).
    raw = _CONFIG.value.to_dict()
    raw["mesh"] = {"data": 1, "fsdp": 1, "tensor": 1}
    cfg = config_lib.from_config_dict(raw)
    block, seq_len = cfg.attention.block_size, cfg.data.seq_len
    lengths = ([int(n) for n in _LENGTHS.value] if _LENGTHS.value else
               [block * 2**i for i in range(int(np.log2(seq_len // block)) + 1)])
    top = cfg.attention.budget_buckets[-1]
    budgets = ([int(k) for k in _BUDGETS.value] if _BUDGETS.value else
               sorted({int(k) for k in np.linspace(1, top, min(top, 8)).round()}))
    table = profiling.profile_layer(cfg.model, cfg.attention, lengths, budgets,
                                    repeats=_REPEATS.value)
    path = latency.save_table(_OUT.value or cfg.balance.latency_table, table)
    print(f"wrote {path}")


if __name__ == "__main__":
    cli.run(main)
