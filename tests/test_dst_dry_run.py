"""experiments.dst_dry_run: DST's decisions on a config's data stream, predictions only."""

import os
import subprocess
import sys

import pytest

from configs import accuracy_study
from experiments.dst_dry_run import dry_run
from sparsebalance_jax.config import ConfigError


def _config(batcher: str, dead_band: float = 0.0):
    raw = accuracy_study.get_config("sparsebalance,cpu")
    raw.data.batcher = batcher
    raw.balance.dead_band = dead_band
    return raw


def test_unbalanced_batches_move_budgets_toward_balance():
    row = dry_run(_config("random"), num_shards=4, steps=12)
    assert row["steps"] == 12 and row["shards"] == 4 and row["batcher"] == "random"
    assert row["moved_share"] > 0
    # Moves pull shards toward the anchor: never a worse predicted imbalance on average.
    assert row["imbalance_after_mean"] < row["imbalance_before_mean"]
    assert 0 < row["one_block_cost"] < 1


def test_a_dead_band_wider_than_any_gap_moves_nothing():
    row = dry_run(_config("random", dead_band=0.9), num_shards=4, steps=6)
    assert row["moved_share"] == 0
    assert row["imbalance_after_mean"] == row["imbalance_before_mean"]


def test_needs_dst_on():
    raw = _config("lbb")
    raw.balance.dst = False
    with pytest.raises(ConfigError, match="balance.dst"):
        dry_run(raw, num_shards=2, steps=1)


def test_gpu_preset_stream_on_cpu():
    # The published rows use the GPU preset's data (8K rows); the dry run needs no GPU for it.
    row = dry_run(accuracy_study.get_config("sparsebalance,gpu"), num_shards=2, steps=3)
    assert (row["shards"], row["steps"], row["block_size"], row["base_budget"]) == (2, 3, 256, 4)
    assert 1.0 <= row["imbalance_after_mean"] <= row["imbalance_before_max"]


def test_a_shard_count_below_one_is_named():
    done = subprocess.run(
        [sys.executable, "-m", "experiments.dst_dry_run",
         "--config=configs/accuracy_study.py:sparsebalance", "--shards=2,0"],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "config error: --shards: ['2', '0'] must be data-shard counts >= 1" in done.stderr
