#!/usr/bin/env bash
# The probe placed on the step's mesh, one shard's rows per call as each device probes its own
# (trace_probe --shards=1), the straggler benchmark charging the slowest shard's probe, the
# main job for eight steps (its DST decision probing on the mesh), and the GPU-marked tests.
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session32/call2.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 90 python3 -m experiments.trace_probe --config=configs/longbench.py:gpu --shards=1 \
    --config.model.num_layers=4 --config.attention.block_size=512 \
    --config.attention.budget=16 --config.attention.budget_buckets='(16,24)' \
    --config.data.seq_len=32768 --config.data.max_doc_len=32768 --config.data.micro_batches=1 \
    --config.data.rows_per_micro_batch=1 --strides=1,8 > "$OUT/probe.log" 2>&1
echo "trace_probe: exit $?"; grep "query stride" "$OUT/probe.log"
t0=$(date +%s)
timeout 240 python3 -m experiments.bench_balance --latency_table=latency_tables \
    --seq_len=32768 --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=8 \
    --micro_batches=1 --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -11 "$OUT/bench.log"
timeout 120 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=8 --config.optimizer.warmup_steps=2 \
    --config.train.workdir=/tmp/main_run > "$OUT/train_8_steps.log" 2>&1
echo "train (8 steps): exit $?"
cp /tmp/main_run/metrics.jsonl "$OUT/" && python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(f"step {m['step']}: loss {m['loss']:.3f} step {m['step_time_s']:.4f} s, "
          f"tokens/s {m['tokens_per_s']:,.0f} (rows {m['row_tokens_per_s']:,.0f}), "
          f"tuner {m.get('tuner/overhead_ms', float('nan')):.2f} ms, compiles {m['compiles']}")
PY
gpu_tests 200 tests/test_moba_kernel.py tests/test_moba_hopper.py tests/test_moba_gate.py \
    tests/test_shard_timing.py -m gpu
pack_out
