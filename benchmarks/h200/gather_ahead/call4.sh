#!/usr/bin/env bash
# Device call 4 (2026-12-02): HEAD's kernels (row ids read ahead) beside cuDNN at 16/16 x 128,
# S=32K, block 512: top-3 under k_max 3 (a second reading after call 2's), and the budget sweep
# k = 2..16 under k_max 16 (one compile; R^2 of time against k, k = 8 and 16 beside cuDNN).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 420 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --sweep 16 --out "$OUT/h128_sweep.json" \
    > "$OUT/h128_sweep.log" 2>&1
echo "bench_kernel: exit $?"
grep -vE "^\{" "$OUT/h128_sweep.log" | tail -30
