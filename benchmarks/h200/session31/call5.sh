#!/usr/bin/env bash
# DST's coverage probe asking the gate's ranking only up to the base budget (call 4 traced the
# probe up to the largest bucket), then call 3's straggler benchmark on the profiled latency
# model of call 4's table (latency_tables/, a call's fixed part paid once per micro-batch).
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session31/call5.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 100 python3 -m experiments.trace_probe --config=configs/longbench.py:gpu --shards=8 \
    --config.model.num_layers=4 --config.attention.block_size=512 \
    --config.attention.budget=16 --config.attention.budget_buckets='(16,24)' \
    --config.data.seq_len=32768 --config.data.max_doc_len=32768 --config.data.micro_batches=1 \
    --config.data.rows_per_micro_batch=1 > "$OUT/probe.log" 2>&1
echo "trace_probe: exit $?"; grep -v "^I1\|^W1" "$OUT/probe.log" | head -12
t0=$(date +%s)
timeout 420 python3 -m experiments.bench_balance --latency_table=latency_tables \
    --seq_len=32768 --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=8 \
    --micro_batches=1 --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -11 "$OUT/bench.log"
pack_out
