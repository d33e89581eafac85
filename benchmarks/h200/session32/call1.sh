#!/usr/bin/env bash
# DST's coverage probe on a systematic sample of query tokens (balance.probe_stride): its time
# and its curve's distance from every token's at strides 1, 4, 8 and 16, then the straggler
# benchmark of the thirty-first session's call 6 at the default stride (8).
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session32/call1.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 150 python3 -m experiments.trace_probe --config=configs/longbench.py:gpu --shards=8 \
    --config.model.num_layers=4 --config.attention.block_size=512 \
    --config.attention.budget=16 --config.attention.budget_buckets='(16,24)' \
    --config.data.seq_len=32768 --config.data.max_doc_len=32768 --config.data.micro_batches=1 \
    --config.data.rows_per_micro_batch=1 --strides=1,4,8,16 > "$OUT/probe.log" 2>&1
echo "trace_probe: exit $?"; grep "query stride" "$OUT/probe.log"
t0=$(date +%s)
timeout 300 python3 -m experiments.bench_balance --latency_table=latency_tables \
    --seq_len=32768 --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=8 \
    --micro_batches=1 --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -11 "$OUT/bench.log"
pack_out
