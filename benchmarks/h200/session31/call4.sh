#!/usr/bin/env bash
# Where DST's coverage probe spends its ~6 ms (call 3's benchmark setting: 8 shards x one 32K
# row, 4 layers, block 512, budgets to 24), then the layer's latency table on the Hopper MoBA
# kernels with padding rows timed at every length. Needs .whl/ carried. Results in $OUT.
# Usage on the device: bash benchmarks/h200/session31/call4.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
t0=$(date +%s)
timeout 100 python3 -m experiments.trace_probe --config=configs/longbench.py:gpu --shards=8 \
    --config.model.num_layers=4 --config.attention.block_size=512 \
    --config.attention.budget=16 --config.attention.budget_buckets='(16,24)' \
    --config.data.seq_len=32768 --config.data.max_doc_len=32768 --config.data.micro_batches=1 \
    --config.data.rows_per_micro_batch=1 > "$OUT/probe.log" 2>&1
echo "trace_probe: exit $? after $(( $(date +%s) - t0 )) s"; grep -v "^I1\|^W1" "$OUT/probe.log" | tail -34
t0=$(date +%s)
timeout 440 python3 -m experiments.profile_latency --config=configs/longbench.py:gpu \
    --config.mesh.data=1 --config.attention.block_size=512 --config.attention.budget=16 \
    --config.attention.budget_buckets='(16,24)' --config.data.seq_len=32768 \
    --config.data.max_doc_len=32768 --lengths=512,1024,2048,4096,8192,16384,32768 \
    --budgets=1,4,8,12,16,20,24 --repeats=2 --out_dir="$OUT/tables" > "$OUT/profile.log" 2>&1
echo "profile_latency: exit $? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/profile.log"
pack_out
