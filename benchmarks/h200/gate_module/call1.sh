#!/usr/bin/env bash
# Device call 1 (2026-12-02, seventeenth session): the tree with the fused gate kernel in
# gating.py (f6f2225; kernels unchanged): every GPU-marked test (the notebook's aside), then
# the top-3 point beside cuDNN (16/16 x 128, block 512, S=32K, k_max 3). One tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 330 python3 -m pytest tests -m gpu --ignore=tests/test_notebook.py -p no:cacheprovider \
    -ra > "$OUT/gpu_tests.log" 2>&1
echo "pytest -m gpu: exit $?"
grep -E "passed|failed|SKIPPED|FAILED|Error" "$OUT/gpu_tests.log" | tail -8
timeout 200 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128_b512: exit $?"
grep -vE "^\{" "$OUT/h128_b512.log" | tail -6
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
