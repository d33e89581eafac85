#!/usr/bin/env bash
# Device call 7 (ninth 2026-12-01 session, 8166a69): 14/2 x 64 at block 512, top-16, and 16/16 x
# 128 at block 256, top-3 and top-8, each beside cuDNN in its own process (k_max = k).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 130 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 16 --heads h64 --out $OUT/h64_k16.json > $OUT/h64_k16.log 2>&1
echo "exit $?"
timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 256 --ks 3 8 --heads h128 --out $OUT/h128_b256.json > $OUT/h128_b256.log 2>&1
echo "exit $?"
for f in h64_k16 h128_b256; do sed -n '/^kind /,$p' $OUT/$f.log; done
