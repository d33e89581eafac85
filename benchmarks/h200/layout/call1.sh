#!/usr/bin/env bash
# Device call 1 (2026-12-01, eighth session): dk/dv without ping-pong at 14/2 x 64 (the working
# tree's new default) against ping-pong (ab_pp, the last commit), two rounds each, then the
# compiled Hopper kernels' GPU test with the new default.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p $OUT/h64
TREES=". ab_pp" ROUNDS=2 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -q -p no:cacheprovider \
    > $OUT/pytest_hopper_gpu.txt 2>&1
echo "pytest tests/test_moba_hopper.py -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_hopper_gpu.txt | tail -1))"
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
grep -h "registers" $OUT/*/ptxas.txt | grep dkv
