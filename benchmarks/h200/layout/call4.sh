#!/usr/bin/env bash
# Device call 4 (prepared in the eighth 2026-12-01 session, run in the ninth on 782d47a): the
# committed code beside cuDNN - 14/2 x 64 at top-3 and top-8, block 512 (dk/dv without
# ping-pong since a18d9ec: traced only so far), and 16/16 x 128 at top-3 - then all GPU tests.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 8 --heads h64 --out $OUT/h64.json > $OUT/h64.log 2>&1
echo "h64: exit $?"
timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --out $OUT/h128.json > $OUT/h128.log 2>&1
echo "h128: exit $?"
timeout 200 python3 -m pytest tests -m gpu --ignore=tests/test_notebook.py -q \
    -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_gpu.txt | tail -1))"
for f in h64 h128; do sed -n '/^kind /,$p' $OUT/$f.log; done
