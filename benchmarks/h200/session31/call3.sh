#!/usr/bin/env bash
# The one-GPU straggler benchmark at 32K rows, one micro-batch per shard (the run of
# BENCHMARKS.md "One micro-batch again"), with DST's coverage probe as one device call per step,
# on the analytic latency model (the Hopper kernels' table did not finish profiling in call 2).
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session31/call3.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
t0=$(date +%s)
timeout 540 python3 -m experiments.bench_balance --seq_len=32768 \
    --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=8 --micro_batches=1 \
    --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -13 "$OUT/bench.log"
pack_out
