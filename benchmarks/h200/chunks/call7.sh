#!/usr/bin/env bash
# Device call 7 (2026-12-01, seventh session): dk/dv without ping-pong at 14/2 x 64 now that
# its chunk steps are 128 rows (ab_nopp) against the committed code; then the committed code's
# step at 16/16 x 128, top-3 under k_max 3 and 4 (the gate unrolled, looped).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p $OUT/h64 $OUT/k3 $OUT/k4
TREES=". ab_nopp" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
TREES="." ROUNDS=1 OUT=$OUT/k3 bash experiments/h200/ab_call.sh > $OUT/k3_call.log 2>&1
TREES="." ROUNDS=1 TRACE_ARGS="--heads h128 --block 512 --k 3 --k-max 4" \
    OUT=$OUT/k4 bash experiments/h200/ab_call.sh > $OUT/k4_call.log 2>&1
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
grep -h "registers" $OUT/*/ptxas.txt | grep dkv
