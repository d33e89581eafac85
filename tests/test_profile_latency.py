"""experiments/profile_latency.py: the points it profiles by default and where the table goes,
with the layer's profiling replaced by a record of what it was asked (run in a subprocess:
the command's absl flags would clash with other experiments' in the test process)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DRIVER = """
import json, sys
from absl import flags
from experiments import profile_latency
from sparsebalance_jax.balance import latency, profiling

def profile_layer(model_cfg, attention_cfg, lengths, budgets, *, repeats):
    return {"d_model": model_cfg.d_model, "block": attention_cfg.block_size,
            "lengths": list(lengths), "budgets": list(budgets), "repeats": repeats}

def save_table(table_dir, table):
    print(json.dumps(dict(table, table_dir=table_dir)))
    return table_dir

profiling.profile_layer, latency.save_table = profile_layer, save_table
for argv in json.loads(sys.argv[1]):
    sys.argv = ["profile_latency", *argv]  # where the config flag reads its overrides
    flags.FLAGS.unparse_flags()
    flags.FLAGS(sys.argv)
    profile_latency.main([])
"""


def _asked(*argvs):
    """What profile_layer and save_table were given, per command line."""
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_default_points_and_table_folder():
    """Lengths double from one block up to data.seq_len; budgets run 1..the largest bucket in
    up to 8 rounded steps; the table goes to balance.latency_table unless --out_dir says. The
    gpu preset's mesh takes every device (-1): profiling one layer on one device must not
    depend on it (README's command on the GPU machine)."""
    gpu, cpu, given = _asked(
        ["--config=configs/longbench.py:gpu"],
        ["--config=configs/longbench.py:cpu", "--config.attention.budget_buckets=(4,16)"],
        ["--config=configs/longbench.py:cpu", "--lengths=64,192", "--budgets=2,5",
         "--repeats=2", "--out_dir=/tmp/tables"])
    assert gpu == {"d_model": 896, "block": 512,
                   "lengths": [512, 1024, 2048, 4096, 8192, 16384, 32768],
                   "budgets": [1, 2, 3, 4, 5, 6, 7, 8], "repeats": 5,
                   "table_dir": "latency_tables"}
    # linspace(1, 16, 8) = 1, 3.14, 5.29, 7.43, 9.57, 11.71, 13.86, 16
    assert cpu == {"d_model": 128, "block": 64, "lengths": [64, 128, 256, 512, 1024],
                   "budgets": [1, 3, 5, 7, 10, 12, 14, 16], "repeats": 5,
                   "table_dir": "latency_tables"}
    assert given == {"d_model": 128, "block": 64, "lengths": [64, 192], "budgets": [2, 5],
                     "repeats": 2, "table_dir": "/tmp/tables"}
