#!/usr/bin/env bash
# Device call 1: dk/dv's four small row copies per chunk step (lse, delta, segments, positions)
# as bulk copies (common._bulk_copy) instead of tensor copies. The Hopper GPU tests on the
# working tree; the traced A/B against ab_base (HEAD's kernels, carried) at 16/16 x 128, block
# 512, top-3 (two rounds, PTX kept) and 14/2 x 64, block 256, top-8 (one round); then at the GPU
# preset's point, 14/2 x 64, block 512, top-3 (one round). Everything packed.
# Usage on the device: bash benchmarks/h200/dkv_bulk/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 150 tests/test_moba_hopper.py -m gpu
ab_pair 2 1
mkdir -p "$OUT/h64_b512"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" OUT="$OUT/h64_b512" \
    bash experiments/h200/ab_call.sh > "$OUT/h64_b512/call.log" 2>&1
echo "ab_call h64 b512: exit $?"
sed -n '/per trace/,$p' "$OUT/h64_b512/call.log"
pack_out
