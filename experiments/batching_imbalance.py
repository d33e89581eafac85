"""Predicted shard imbalance of the random / lbb / sab batchers, and host costs, on CPU.

    python -m experiments.batching_imbalance [--out_dir=runs/batching_imbalance]

For LongAlign-like (long tail) and ChatQA2-like (bimodal) document lengths at their real scale,
4 and 8 data shards, and windows of 1..16 global batches: the mean over steps of max/mean of
the shards' predicted step time (analytic latency model of a Qwen2.5-0.5B-shaped layer, MoBA
block 256, base budget 32: the SparseBalance paper's setting; micro-batches of one 72K row).
Two costings of padding: `fixed` (the dense layers run over padding, as in a fixed-shape
step: what the trainer does) and `free` (only document tokens cost, as in a variable-length
step). Also reports the cost estimator's documents/second, the batchers' planning throughput
and the tuner's host time per decision. Writes imbalance.md and imbalance.json to --out_dir.
Expected: sab <= 1.10 on both distributions at 8 shards from window 2 up, under both costings.
"""

import json
import os
import time

import numpy as np
from absl import flags

from experiments import cli
from sparsebalance_jax.balance import latency, tuner
from sparsebalance_jax.data import batching
from sparsebalance_jax.data.lengths import sample_lengths
from sparsebalance_jax.jsonfile import write_json, write_text

_OUT = flags.DEFINE_string("out_dir", "runs/batching_imbalance", "Where to write md + json.")
_DOCS = flags.DEFINE_integer("docs", 6000, "Documents drawn per distribution.")
_WINDOWS = flags.DEFINE_list("windows", ["1", "2", "4", "8", "16"], "Window sizes.")
_SHARDS = flags.DEFINE_list("shards", ["4", "8"], "Data-shard counts.")
_MICRO = flags.DEFINE_integer("micro_batches", 2, "Micro-batches per shard and step.")
_ROW_LEN = flags.DEFINE_integer("row_len", 73728, "Tokens per row (>= the longest document).")
_BLOCK = flags.DEFINE_integer("block_size", 256, "MoBA block size (= packing alignment).")
_BUDGET = flags.DEFINE_integer("base_budget", 32, "Base MoBA budget k.")
_FILL = flags.DEFINE_float("fill", batching.DEFAULT_FILL, "Window token fill target.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of lengths and batchers.")

SHAPE_05B = dict(d_model=896, num_heads=14, num_kv_heads=2, head_dim=64, mlp_dim=4864)
KINDS = ("longalign", "chatqa2")


def _host_costs(model: latency.LatencyModel, lengths: np.ndarray, base_budget: int,
                num_shards: int) -> dict:
    many = np.resize(lengths, 1_000_000)
    start = time.perf_counter()
    model.doc_seconds(many, base_budget)
    docs_per_s = many.size / (time.perf_counter() - start)
    config = tuner.TunerConfig(anchor="mean", p=0.3, coverage_floor=0.0,
                               buckets=(base_budget, 2 * base_budget))
    t = tuner.Tuner(config, num_units=num_shards)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(200):
        start = time.perf_counter()  # the table is part of the decision's host cost
        docs_SMD = rng.choice(lengths, size=(num_shards, 2, 3))
        seconds_SK = tuner.shard_latency_table(docs_SMD, model, config.k_max)
        t.decide(base_budget, seconds_SK)
        times.append(time.perf_counter() - start)
    return {"estimator_docs_per_s": docs_per_s, "tuner_decide_ms_mean": 1e3 * np.mean(times),
            "tuner_decide_ms_p99": 1e3 * np.percentile(times, 99)}


def main(argv):
    del argv
    shape = latency.LayerShape(block_size=_BLOCK.value, **SHAPE_05B)
    models = {"fixed": latency.AnalyticLatencyModel(shape),
              "free": latency.AnalyticLatencyModel(shape, padding_is_free=True)}
    windows = [int(w) for w in _WINDOWS.value]
    shard_counts = [int(s) for s in _SHARDS.value]
    results, plan_rate = [], {}
    for kind in KINDS:
        lengths = sample_lengths(kind, np.random.default_rng(_SEED.value), _DOCS.value, 1.0,
                                 64, _ROW_LEN.value)
        for padding, model in models.items():
            for shards in shard_counts:
                geometry = batching.StepGeometry(shards, _MICRO.value, 1, _ROW_LEN.value,
                                                 _BLOCK.value)
                for window in windows:
                    row = dict(kind=kind, padding=padding, shards=shards, window=window,
                               steps={})
                    for method in batching.BATCHERS:
                        start = time.perf_counter()
                        ratios = batching.simulate_imbalance(
                            method, lengths, geometry, model, _BUDGET.value, window,
                            _SEED.value, _FILL.value)
                        plan_rate.setdefault(method, []).append(
                            len(lengths) / (time.perf_counter() - start))
                        row[method] = float(ratios.mean())
                        row["steps"][method] = int(ratios.size)
                    results.append(row)
                    print(row, flush=True)
    lengths = sample_lengths("longalign", np.random.default_rng(_SEED.value), 4096, 1.0, 64,
                             _ROW_LEN.value)
    host = _host_costs(models["fixed"], lengths, _BUDGET.value, max(shard_counts))
    host["plan_docs_per_s"] = {m: float(np.median(r)) for m, r in plan_rate.items()}
    settings = dict(docs=_DOCS.value, micro_batches=_MICRO.value, rows=1, row_len=_ROW_LEN.value,
                    block_size=_BLOCK.value, base_budget=_BUDGET.value, fill=_FILL.value,
                    shape=SHAPE_05B, seed=_SEED.value)
    os.makedirs(_OUT.value, exist_ok=True)
    write_json(os.path.join(_OUT.value, "imbalance.json"),
               {"settings": settings, "results": results, "host": host}, indent=1)
    lines = [f"Predicted imbalance (mean over steps of max/mean shard time); settings: "
             f"{json.dumps(settings)}", "",
             "| lengths | padding | shards | window | steps (random / lbb / sab) | random | lbb "
             "| sab |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['padding']} | {r['shards']} | {r['window']} | "
              + " / ".join(str(r["steps"][m]) for m in batching.BATCHERS)
              + f" | {r['random']:.3f} | {r['lbb']:.3f} | {r['sab']:.3f} |" for r in results]
    lines += ["", f"Cost estimator: {host['estimator_docs_per_s']:.3g} documents/s; planning "
              + ", ".join(f"{m} {v:.3g} docs/s" for m, v in host["plan_docs_per_s"].items())
              + f"; tuner decide ({max(shard_counts)} shards): "
              f"{host['tuner_decide_ms_mean']:.3f} ms mean, {host['tuner_decide_ms_p99']:.3f} ms "
              "p99."]
    write_text(os.path.join(_OUT.value, "imbalance.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    cli.run(main)
