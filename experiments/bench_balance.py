"""Straggler benchmark: MoBA + LBB vs +DST, +SAB, +SAB+DST, simulated or on a real mesh.

    python -m experiments.bench_balance [--latency_table=DIR] [--out=DIR] [--data_parallel=mesh]

--data_parallel=simulated (default): every shard's micro-batches run forward+backward on the
one device and are timed; a step costs the slowest shard plus a modeled all-reduce (see
`sparsebalance_jax.balance.simulate` for the exact rules). --data_parallel=mesh: one shard per
device (--shards devices), each shard's compute timed by its device's clock and the step by the
trainer's fused SPMD step with its real all-reduce (`sparsebalance_jax.balance.mesh_runner`);
the same documents, batchers and tuner. Model: the `gpu` preset of configs/longbench.py
(Qwen2.5-0.5B shape) with --layers layers; MoBA block --block_size, base budget --budget,
compiled buckets --buckets; tuner anchor / p / coverage floor / EMA decay from the config's
`balance` section. Documents: the config's text source with LongAlign-like and ChatQA2-like
lengths scaled so the longest possible document (72K) fills one row of --seq_len tokens.
Writes bench_balance.json (every step: per-shard predicted and measured times, budgets,
coverage), bench_balance.png and bench_balance.md to --out, and prints the table last.

On one H200 with a profiled latency table (profile ~2 min, benchmark ~5 min, both workloads):
    python -m experiments.profile_latency --config=configs/longbench.py:gpu \
        --config.mesh.data=1 --config.attention.block_size=256 --config.attention.budget=16 \
        --config.attention.budget_buckets='(16,24)' --config.data.seq_len=16384 \
        --config.data.max_doc_len=16384 --lengths=256,512,1024,2048,4096,8192,16384 \
        --budgets=1,4,8,12,16,20,24 --repeats=3 --out_dir=$OUT/tables
    python -m experiments.bench_balance --latency_table=$OUT/tables --repeats=2

On two H200s, real collectives (same settings, one shard per GPU):
    python -m experiments.bench_balance --latency_table=$OUT/tables --repeats=2 --shards=2 \
        --data_parallel=mesh

Results written before a DST row's step counted its decision's coverage probe, counted with
the probe's synchronous call (no device: `simulate.recount_decision`; prints the DST rows'
step, speedup and tuner overhead):
    python -m experiments.bench_balance --recount=benchmarks/h200/bench_balance.json

Tiny CPU run (Pallas interpret mode, the `cpu` preset's model):
    python -m experiments.bench_balance --interpret --shards=2 --steps=2 --seq_len=256 \
        --block_size=32 --budget=4 --buckets=4,6 --layers=1 --repeats=1 --min_doc_len=16 \
        --out=/tmp/bench_balance
"""

import dataclasses
import importlib
import json
import os
import time

from absl import flags

from experiments import cli
from sparsebalance_jax.jsonfile import write_json, write_text

_WORKLOADS = flags.DEFINE_list("workloads", ["longalign", "chatqa2"], "Length distributions.")
_SHARDS = flags.DEFINE_integer("shards", 8,
                               "Data-parallel shards (devices, with --data_parallel=mesh).")
_DEVICES = flags.DEFINE_list("devices", None, "With --data_parallel=mesh: device ids in shard "
                             "order (default: the first --shards devices).")
_DATA_PARALLEL = flags.DEFINE_enum(
    "data_parallel", "simulated", ["simulated", "mesh"],
    "simulated: every shard in turn on one device, modeled all-reduce; mesh: one shard per "
    "device, the trainer's step with its real all-reduce.")
_STEPS = flags.DEFINE_integer("steps", 6, "Global batches of documents per workload.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 16384, "Tokens per packed row.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers (the preset's shape otherwise).")
_MICRO = flags.DEFINE_integer("micro_batches", 2, "Micro-batches per shard and step.")
_ROWS = flags.DEFINE_integer("rows", 1, "Rows per micro-batch.")
_BLOCK = flags.DEFINE_integer("block_size", 256, "MoBA block size.")
_BUDGET = flags.DEFINE_integer("budget", 16, "Base MoBA budget k (blocks per query).")
_BUCKETS = flags.DEFINE_list("buckets", ["16", "24"], "Budget buckets (static k_max values).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per micro-batch (median), after one "
                                "warm-up call.")
_TABLE = flags.DEFINE_string("latency_table", "", "Profiled latency tables folder; empty: the "
                             "analytic latency model.")
_BUS = flags.DEFINE_float("bus_gbps", 400.0, "All-reduce bus bandwidth, GB/s (NVLink-class).")
_ATTENTION = flags.DEFINE_enum("attention", "moba", ["moba", "reference"],
                               "Attention implementation (reference: dense, ignores budgets).")
_INTERPRET = flags.DEFINE_bool("interpret", False, "CPU run: Pallas interpret mode and the "
                               "config's `cpu` preset model.")
_RAISE_IN_BUCKET = flags.DEFINE_bool(
    "raise_within_bucket", True, "DST raises light shards only within the base budget's bucket "
    "(balance.raise_within_bucket); --noraise_within_bucket lets raises enlarge the step's k_max.")
_MIN_DOC = flags.DEFINE_integer("min_doc_len", 128, "Shortest document in tokens.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of documents, batchers and parameters.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: $OUT, else runs/bench_balance).")
_RECOUNT = flags.DEFINE_string(
    "recount", None, "A bench_balance.json whose DST steps left out the decision's coverage "
    "probe: print its DST rows counted with it, and run nothing.")

_LONGEST_UNSCALED = 72 * 1024  # Longest document of both length distributions at real scale.


def _config():
    from sparsebalance_jax import config as config_lib

    raw = importlib.import_module("configs.longbench").get_config(
        "cpu" if _INTERPRET.value else "gpu")
    raw.model.num_layers = _LAYERS.value
    # One device runs every shard in turn (simulated), or one shard per device (mesh).
    raw.mesh.data = _SHARDS.value if _DATA_PARALLEL.value == "mesh" else 1
    raw.mesh.fsdp = raw.mesh.tensor = 1
    raw.attention.implementation = _ATTENTION.value
    raw.balance.dst = _ATTENTION.value == "moba"  # The config allows DST on MoBA only.
    raw.attention.interpret = _INTERPRET.value
    raw.attention.block_size = _BLOCK.value
    raw.attention.budget = _BUDGET.value
    raw.attention.budget_buckets = tuple(int(b) for b in _BUCKETS.value)
    raw.data.seq_len = _SEQ_LEN.value
    raw.data.min_doc_len = _MIN_DOC.value
    raw.data.max_doc_len = _SEQ_LEN.value
    raw.data.micro_batches = _MICRO.value
    raw.data.rows_per_micro_batch = _ROWS.value
    raw.data.seed = _SEED.value
    # Text documents only (the workloads set their lengths).
    raw.data.text_weight, raw.data.synthetic_weight, raw.data.jsonl_weight = 1.0, 0.0, 0.0
    raw.balance.raise_within_bucket = _RAISE_IN_BUCKET.value
    return config_lib.from_config_dict(raw)


def _recount(path: str) -> None:
    from sparsebalance_jax.balance import report, simulate

    with open(path) as f:
        results = simulate.recount_decision(json.load(f))["workloads"]
    print(report.decision_table(results, [m.name for m in simulate.METHODS if m.dst]))


def main(argv):
    del argv
    if _RECOUNT.value:
        _recount(_RECOUNT.value)
        return
    import jax

    from sparsebalance_jax.balance import latency, mesh_runner, report, simulate
    from sparsebalance_jax.training.budgets import tuner_config
    from sparsebalance_jax.training.launch import data_spec

    out = _OUT.value or os.environ.get("OUT") or "runs/bench_balance"
    os.makedirs(out, exist_ok=True)
    cfg = _config()
    b = cfg.balance
    setup = simulate.BenchSetup(
        num_shards=_SHARDS.value, micro_batches=_MICRO.value, rows_per_micro_batch=_ROWS.value,
        row_len=_SEQ_LEN.value, steps=_STEPS.value, base_budget=_BUDGET.value,
        tuner=tuner_config(cfg),
        ema_decay=b.ema_decay, repeats=_REPEATS.value, bus_bytes_per_s=_BUS.value * 1e9,
        seed=_SEED.value)
    device = jax.devices()[0]
    shape = latency.LayerShape.from_configs(cfg.model, cfg.attention)
    kind = "profiled" if _TABLE.value else "analytic"
    cost_model = latency.make_latency_model(kind, shape, table_dir=_TABLE.value,
                                            device_kind=device.device_kind)
    start = time.perf_counter()
    mesh = _DATA_PARALLEL.value == "mesh"
    if mesh:
        by_id = {d.id: d for d in jax.devices()}
        ids = [int(i) for i in _DEVICES.value] if _DEVICES.value else None
        if ids is not None and not set(ids) <= set(by_id):
            raise ValueError(f"--devices={_DEVICES.value}: device ids are {sorted(by_id)}")
        runner = mesh_runner.MeshRunner(cfg, _SEED.value,
                                        None if ids is None else [by_id[i] for i in ids])
    elif _DEVICES.value:
        raise ValueError("--devices needs --data_parallel=mesh (the simulation uses one device)")
    else:
        runner = simulate.DeviceRunner(cfg, _SEED.value)
    allreduce = simulate.allreduce_seconds(runner.param_bytes, setup.num_shards,
                                           setup.bus_bytes_per_s)
    settings = dict(
        device=device.device_kind, backend=jax.default_backend(), latency_model=kind,
        latency_table=_TABLE.value, layers=_LAYERS.value, layer_shape=shape.key(),
        attention=_ATTENTION.value, interpret=_INTERPRET.value, shards=setup.num_shards,
        micro_batches=setup.micro_batches, rows_per_micro_batch=setup.rows_per_micro_batch,
        seq_len=setup.row_len, steps=setup.steps, base_budget=setup.base_budget,
        buckets=list(setup.tuner.buckets), anchor=b.anchor, p=b.p,
        coverage_floor=b.coverage_floor, ema_decay=b.ema_decay, dead_band=b.dead_band,
        raise_within_bucket=b.raise_within_bucket, repeats=setup.repeats,
        data_parallel=_DATA_PARALLEL.value,
        devices=[str(d) for d in runner.mesh.devices.ravel()] if mesh else [str(device)],
        timing=("per step: shards by each device's clock over the collective-free gradient "
                "program, the step by the fused SPMD train step's blocking wall time; 1 warm-up "
                "call, then the median of `repeats`" if mesh else
                "per micro-batch: 1 warm-up call, then the median of `repeats` blocking calls"),
        coverage=("the decision's probe: moba_coverage_curve on layer-0 q/k over every "
                  f"{b.probe_stride}-th query (balance.probe_stride); the report's: "
                  "moba_coverage_curve up to the largest bucket over every query"),
        probe_stride=b.probe_stride,
        param_bytes=runner.param_bytes, bus_gbps=_BUS.value, allreduce_seconds=allreduce,
        length_scale=_SEQ_LEN.value / _LONGEST_UNSCALED, min_doc_len=_MIN_DOC.value,
        seed=_SEED.value)
    print(json.dumps(settings), flush=True)

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {line}", flush=True)

    # Dense attention ignores the budgets, so the DST rows would only report budgets and
    # coverage that nothing ran at.
    methods = [m for m in simulate.METHODS if _ATTENTION.value == "moba" or not m.dst]
    if len(methods) < len(simulate.METHODS):
        log(f"--attention={_ATTENTION.value}: the DST rows are left out (dense attention "
            "ignores budgets)")
    results = {}
    for workload in _WORKLOADS.value:
        spec = dataclasses.replace(data_spec(cfg), length_distribution=workload,
                                   length_scale=_SEQ_LEN.value / _LONGEST_UNSCALED)
        results[workload] = simulate.run_workload(spec, setup, runner, cost_model,
                                                  _BLOCK.value, log, methods)
    settings["compiles_total"] = runner.compiles
    settings["wall_seconds"] = time.perf_counter() - start
    write_json(os.path.join(out, "bench_balance.json"),
               {"settings": settings, "workloads": results})
    title = (f"{device.device_kind}, {'real data parallelism' if mesh else 'simulated'}: "
             f"{_LAYERS.value}-layer {shape.key()}, {setup.num_shards} "
             f"shards x {setup.micro_batches} x {setup.rows_per_micro_batch} rows of "
             f"{setup.row_len}, budget {setup.base_budget}, {kind} latency model")
    report.write_png(os.path.join(out, "bench_balance.png"), results, title)
    table = report.markdown_table(results)
    step_rule = ("step: the fused SPMD step's wall time (real all-reduce)" if mesh else
                 f"all-reduce modeled: {1e3 * allreduce:.2f} ms/step at {_BUS.value:g} GB/s")
    write_text(os.path.join(out, "bench_balance.md"),
               f"{title}; {step_rule}; {runner.compiles} compiles in total.\n\n{table}\n")
    log(f"wrote {out}/bench_balance.{{json,png,md}}; {runner.compiles} compiles in total")
    print(title, flush=True)
    print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
