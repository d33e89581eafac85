"""What DST would decide on a config's real data stream, without a model or a GPU.

    python -m experiments.dst_dry_run --config=configs/accuracy_study.py:sparsebalance,gpu \
        --shards=2,4,8 --steps=200 [--config.a.b=value ...]

For each data-shard count, draws `--steps` step batches from the config's own pipeline and
batcher (the same documents a training run would see), prices them with the config's latency
model and runs the trainer's DST decision (`training.budgets.DstBalancer`) on the predictions
alone: no measured shard times (so no EMA correction and only the configured dead band) and no
coverage floor (every coverage reads 1.0, so the floor never stops a decrease: moves here are
an upper bound on what a run with the floor makes). Prints, per shard count, the share of
(step, shard) budgets moved off the base, the predicted imbalance (max / mean of the shards'
predicted step times) before and after the decision, and the predicted cost of one budget
block (the median over shards of L(b) / L(b - 1) - 1 at the base b). A shard moves only when
its gap to the anchor exceeds both the dead band (balance.dead_band) and about half a block
(a smaller gap is closer to the anchor than a one-block move would leave it). Writes the rows
as JSON to --out when given.
"""

from __future__ import annotations

import json

import numpy as np
from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.")
_SHARDS = flags.DEFINE_list("shards", None, "Data-shard counts (default: the config's mesh.data).")
_STEPS = flags.DEFINE_integer("steps", 200, "Step batches drawn per shard count.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the rows.")


def dry_run(raw, num_shards: int, steps: int) -> dict:
    """DST's decisions on `steps` step batches of `raw` (a get_config() dict) at num_shards."""
    from sparsebalance_jax.balance import tuner
    from sparsebalance_jax.config import ConfigError, from_config_dict
    from sparsebalance_jax.training import budgets, launch

    raw = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
    raw["mesh"] = dict(raw.get("mesh", {}), data=num_shards, fsdp=1, tensor=1)
    cfg = from_config_dict(raw, device_count=num_shards)
    if not cfg.balance.dst:
        raise ConfigError("balance.dst: the dry run needs DST on (set --config.balance.dst=True)")
    cost_model = launch.latency_model(cfg)
    base, k_max = cfg.attention.budget, cfg.attention.budget_buckets[-1]
    balancer = budgets.DstBalancer(
        cfg, cost_model, lambda batch, params: np.ones((len(batch["budgets"]), k_max)))
    padded = cfg.data.rows_per_micro_batch * cfg.data.seq_len
    chosen, before, after, block = [], [], [], []
    for _, batch in zip(range(steps), launch.data_iterator(cfg, cost_model)):
        d = balancer.decide(batch, params=None)
        chosen.append(d.shard_budgets_S)
        before.append(d.extra["tuner/imbalance_predicted_before"])
        after.append(d.extra["tuner/imbalance_predicted_after"])
        if base > 1:
            table = tuner.shard_latency_table(batch["doc_lengths"], cost_model, k_max, padded,
                                              budget_range=(base - 1, base))
            block.append(np.median(table[:, base] / table[:, base - 1] - 1.0))
    chosen = np.asarray(chosen)
    if chosen.shape != (len(before), num_shards):
        raise RuntimeError(f"DST decided {chosen.shape[1:]} budgets per step for {num_shards} "
                           "shards")
    return {"shards": num_shards, "steps": len(before), "base_budget": base,
            "block_size": cfg.attention.block_size, "batcher": cfg.data.batcher,
            "moved_share": float(np.mean(chosen != base)),
            "mean_abs_move": float(np.mean(np.abs(chosen - base))),
            "imbalance_before_mean": float(np.mean(before)),
            "imbalance_before_max": float(np.max(before)),
            "imbalance_after_mean": float(np.mean(after)),
            "one_block_cost": float(np.median(block)) if block else float("nan")}


def main(argv):
    del argv
    from sparsebalance_jax.config import ConfigError

    raw = _CONFIG.value
    shard_counts = [int(s) if str(s).isdigit() else -1 for s in _SHARDS.value or [raw.mesh.data]]
    if min(shard_counts) < 1:
        raise ConfigError(f"--shards: {_SHARDS.value or raw.mesh.data} must be data-shard counts "
                          ">= 1 (with no --shards, the config's mesh.data is taken)")
    rows = [dry_run(raw, n, _STEPS.value) for n in shard_counts]
    print("shards  batcher  block  base  steps  moved   mean|move|  imbalance before (mean / max)"
          "  after (mean)  one block")
    for r in rows:
        print(f"{r['shards']:6d}  {r['batcher']:7s}  {r['block_size']:5d}  {r['base_budget']:4d}  "
              f"{r['steps']:5d}  {100 * r['moved_share']:5.1f}%  {r['mean_abs_move']:10.3f}  "
              f"{r['imbalance_before_mean']:.4f} / {r['imbalance_before_max']:.4f}"
              f"{'':14s}{r['imbalance_after_mean']:.4f}  {100 * r['one_block_cost']:8.1f}%")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
