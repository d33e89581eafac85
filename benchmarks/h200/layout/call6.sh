#!/usr/bin/env bash
# Device call 6 (ninth 2026-12-01 session, 8166a69): the rest of issue 3's table at the model's
# heads (14/2 x 64) beside cuDNN - block 512 at top-16, block 256 at top-3, 8 and 16 (each
# compiled for k_max = k).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 420 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 256 --ks 3 8 16 --heads h64 --out $OUT/h64_b256.json > $OUT/h64_b256.log 2>&1
echo "h64 block 256: exit $?"
sed -n '/^kind /,$p' $OUT/h64_b256.log
