#!/usr/bin/env bash
# DST's probe prefetched behind the step before (DstBalancer.prefetch): the straggler
# benchmark of call 4 (16 steps) charging every DST step the slowest shard's probe on the
# GPU's own clock, then the main job for eight steps (the loop peeking at the next batch and
# prefetching its probe). Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session32/call5.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
t0=$(date +%s)
timeout 300 python3 -m experiments.bench_balance --latency_table=latency_tables \
    --seq_len=32768 --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=16 \
    --micro_batches=1 --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -11 "$OUT/bench.log"
timeout 180 python3 -m experiments.train --config=configs/longbench.py \
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
pack_out
