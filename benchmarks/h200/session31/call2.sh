#!/usr/bin/env bash
# The one-GPU straggler benchmark at 32K rows, one micro-batch per shard (the run of
# BENCHMARKS.md "One micro-batch again"), with DST's coverage probe as one device call per step
# and the profiled latency model charging a call's fixed part once per micro-batch: first the
# layer's latency table on the Hopper MoBA kernels (padding rows timed at every length), then
# the benchmark on it. Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session31/call2.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
t0=$(date +%s)
timeout 260 python3 -m experiments.profile_latency --config=configs/longbench.py:gpu \
    --config.mesh.data=1 --config.attention.block_size=512 --config.attention.budget=16 \
    --config.attention.budget_buckets='(16,24)' --config.data.seq_len=32768 \
    --config.data.max_doc_len=32768 --lengths=512,1024,2048,4096,8192,16384,32768 \
    --budgets=1,4,8,12,16,20,24 --repeats=3 --out_dir="$OUT/tables" > "$OUT/profile.log" 2>&1
echo "profile_latency: exit $? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/profile.log"
t0=$(date +%s)
timeout 300 python3 -m experiments.bench_balance --latency_table="$OUT/tables" --seq_len=32768 \
    --block_size=512 --budget=16 --buckets=16,24 --repeats=2 --steps=8 --micro_batches=1 \
    --min_doc_len=256 --out="$OUT/b32k_m1" > "$OUT/bench.log" 2>&1
echo "bench_balance: exit $? after $(( $(date +%s) - t0 )) s"; tail -13 "$OUT/bench.log"
pack_out
