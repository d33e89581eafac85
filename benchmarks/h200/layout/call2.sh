#!/usr/bin/env bash
# Device call 2 (2026-12-01, eighth session): the layout's read ranks counted by the gate kernel
# (the working tree) against ab_base (a18d9ec, ranks counted by XLA): the step's GPU time at
# 16/16 x 128 top-3 under k_max 3 (two rounds, with the step's optimized HLO) and 16, and at
# 14/2 x 64; then the compiled Hopper kernels' GPU test (moba_attention end to end, the gate's
# ranks included).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p $OUT/k3 $OUT/k16 $OUT/h64
TREES=". ab_base" ROUNDS=2 HLO=1 OUT=$OUT/k3 bash experiments/h200/ab_call.sh > $OUT/k3_call.log 2>&1
TREES=". ab_base" ROUNDS=1 TRACE_ARGS="--heads h128 --block 512 --k 3 --k-max 16" \
    OUT=$OUT/k16 bash experiments/h200/ab_call.sh > $OUT/k16_call.log 2>&1
TREES=". ab_base" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > $OUT/pytest_hopper_gpu.txt 2>&1
echo "pytest tests/test_moba_hopper.py -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_hopper_gpu.txt | tail -1))"
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
