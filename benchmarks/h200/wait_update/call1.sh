#!/usr/bin/env bash
# Device call 1 of the wait_update schedule (forward and dq at head_dim 128: a step's first
# products and the previous step's update issued in one ping-pong turn and all waited for
# before the softmax / dS, which then runs beside the other warpgroup's turn): the Hopper GPU
# test on the working tree, the traced A/B against ab_base (HEAD before the change, carried)
# at both headline points, and the working tree beside cuDNN at the top-3 point.
# Usage on the device: bash benchmarks/h200/wait_update/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 150 tests/test_moba_hopper.py -m gpu
ab_pair 2
timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_step.json" > "$OUT/h128_step.log" 2>&1
echo "bench h128: exit $?"
grep -B2 -A8 "^kind " "$OUT/h128_step.log" | tail -14
pack_out
