#!/usr/bin/env bash
# S=8K with the kept kernels, 16/16 x 128, block 512, k = 3, 8, 16 (k_max = k), cuDNN timed in
# the same process: the session's last device time. Usage on the device: bash
# benchmarks/h200/grid/call4.sh. The JSON is written after each row, so a cut run keeps them.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout "${LIMIT:-180}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 8192 --blocks 512 --ks 3 8 16 --heads h128 --out "$OUT/h128_8k.json" \
    > "$OUT/h128_8k.log" 2>&1
echo "bench_kernel h128 S=8K: exit $? after $(( $(date +%s) - start )) s"
grep -vE "^\{" "$OUT/h128_8k.log" | tail -8
