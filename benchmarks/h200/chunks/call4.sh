#!/usr/bin/env bash
# Device call 4 (2026-12-01, seventh session): the committed code's GPU tests, then its
# times beside cuDNN at 14/2 x 64 (block 512 and 256, k 3 and 8) and at 16/16 x 128 (top-3,
# and the budget sweep k = 2..16 under k_max 16: R^2 and the bucket's cost).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest tests -m gpu --ignore=tests/test_notebook.py -q \
    -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_gpu.txt | tail -1))"
timeout 160 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 256 --ks 3 8 --heads h64 --out $OUT/h64.json > $OUT/h64.log 2>&1
echo "h64: exit $?"
timeout 230 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --sweep 16 --out $OUT/h128.json > $OUT/h128.log 2>&1
echo "h128: exit $?"
for f in h64 h128; do sed -n '/^kind /,$p' $OUT/$f.log; done
