#!/usr/bin/env bash
# Device call 5 (2026-12-02): HEAD's kernels beside cuDNN at the 0.5B model's attention shape
# (14/2 heads x 64, S=32K, block 256, k = 8 and 16, each its own k_max), the Triton and the
# Mosaic GPU backends.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 420 python3 experiments/bench_kernel.py --skip-check --backends triton mosaic \
    --seqs 32768 --blocks 256 --ks 8 16 --heads h64 --out "$OUT/h64_b256.json" \
    > "$OUT/h64_b256.log" 2>&1
echo "bench_kernel: exit $?"
grep -vE "^\{" "$OUT/h64_b256.log" | tail -12
