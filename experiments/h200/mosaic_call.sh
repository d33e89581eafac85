#!/usr/bin/env bash
# The persistent warp-specialized Mosaic GPU kernels (backend="mosaic": forward, dq, dk/dv)
# in one device call: their GPU test (FULL=1: every GPU test), each kernel alone per key tile /
# pipeline depth beside the Triton one (experiments/persistent_forward.py), forward+backward
# with either kernel set beside cuDNN at the 16/16 x 128 headline points (block 512, k = 3, 8, 16) and at
# 14/2 x 64 (block 256, k = 8), and the GPU-time breakdown of a step with it (trace_moba.py).
#   bash experiments/h200/mosaic_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
CONFIGS=${CONFIGS:-"128,2"}
DQ_CONFIGS=${DQ_CONFIGS:-"64,3,1 64,2,1 64,3,0"}
DKV_STAGES=${DKV_STAGES:-"2"}
if [ "${FULL:-0}" = 1 ]; then TESTS=(tests --ignore=tests/test_notebook.py); else
  TESTS=(tests/test_moba_hopper.py); fi
timeout 200 python3 -m pytest "${TESTS[@]}" -m gpu -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
timeout 150 python3 experiments/persistent_forward.py --configs $CONFIGS --dq-configs $DQ_CONFIGS \
    --dkv-stages $DKV_STAGES \
    --out "$OUT/alone.json" > "$OUT/alone.log" 2>&1
echo "alone: exit $?"; grep -A20 "^kernel " "$OUT/alone.log"
timeout 240 python3 experiments/bench_kernel.py --backends triton mosaic \
    --seqs 32768 --blocks 512 --ks 3 8 16 --heads h128 --out "$OUT/h128.json" \
    > "$OUT/h128.log" 2>&1
echo "h128: exit $?"; grep -A8 "^kind " "$OUT/h128.log"
timeout 60 python3 experiments/trace_moba.py --heads h128 --block 512 --k 3 \
    --backend mosaic --out "$OUT/trace.json" > "$OUT/trace.log" 2>&1
echo "trace: exit $?"; head -12 "$OUT/trace.log"
timeout 70 python3 experiments/bench_kernel.py --skip-check --backends triton mosaic \
    --seqs 32768 --blocks 256 --ks 8 --heads h64 --out "$OUT/h64.json" > "$OUT/h64.log" 2>&1
echo "h64: exit $?"; grep -A8 "^kind " "$OUT/h64.log"
