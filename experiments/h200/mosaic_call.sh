#!/usr/bin/env bash
# The persistent warp-specialized Mosaic GPU forward (forward_kernel="mosaic") in one device
# call: its GPU test (FULL=1: every GPU test), the kernel alone per key tile / pipeline depth
# beside the Triton forward (experiments/persistent_forward.py), forward+backward with either
# forward beside cuDNN at the 16/16 x 128 headline points (block 512, k = 3, 8, 16) and at
# 14/2 x 64 (block 256, k = 8), and the GPU-time breakdown of a step with it (trace_moba.py).
#   bash experiments/h200/mosaic_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
CONFIGS=${CONFIGS:-"128,2 64,2"}
if [ "${FULL:-0}" = 1 ]; then TESTS=(tests --ignore=tests/test_notebook.py); else
  TESTS=(tests/test_moba_hopper.py); fi
timeout 240 python3 -m pytest "${TESTS[@]}" -m gpu -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
timeout 100 python3 experiments/persistent_forward.py --configs $CONFIGS \
    --out "$OUT/alone.json" > "$OUT/alone.log" 2>&1
echo "alone: exit $?"; grep -A8 "^kernel " "$OUT/alone.log"
timeout 170 python3 experiments/bench_kernel.py --forward-kernels triton mosaic \
    --seqs 32768 --blocks 512 --ks 3 8 16 --heads h128 --out "$OUT/h128.json" \
    > "$OUT/h128.log" 2>&1
echo "h128: exit $?"; grep -A8 "^kind " "$OUT/h128.log"
timeout 70 python3 experiments/bench_kernel.py --skip-check --forward-kernels triton mosaic \
    --seqs 32768 --blocks 256 --ks 8 --heads h64 --out "$OUT/h64.json" > "$OUT/h64.log" 2>&1
echo "h64: exit $?"; grep -A8 "^kind " "$OUT/h64.log"
timeout 60 python3 experiments/trace_moba.py --heads h128 --block 512 --k 3 \
    --forward-kernel mosaic --out "$OUT/trace.json" > "$OUT/trace.log" 2>&1
echo "trace: exit $?"; head -8 "$OUT/trace.log"
