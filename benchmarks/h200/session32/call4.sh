#!/usr/bin/env bash
# The straggler benchmark of call 3 over 16 steps (twice the documents) for a tighter
# reading of DST's effect; a DST step is charged the slowest shard's probe call.
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session32/call4.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
t0=$(date +%s)
timeout 480 python3 -m experiments.bench_balance --latency_table=latency_tables \
    --seq_len=32768 --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=16 \
    --micro_batches=1 --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -11 "$OUT/bench.log"
pack_out
