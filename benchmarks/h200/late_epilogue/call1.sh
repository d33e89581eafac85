#!/usr/bin/env bash
# Device call 1 (2026-12-01, tenth session): the forward's epilogue moved under the next item's
# first q K^T (the working tree) against ab_base (HEAD's kernels: the epilogue at the item's
# end): the step's GPU time at 16/16 x 128 top-3 (two rounds) and at 14/2 x 64 (one), then the
# compiled Hopper kernels' GPU tests. Before the call, on this machine:
#   mkdir ab_base && git archive HEAD pallas_kernels experiments | tar -x -C ab_base
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
[ -d ab_base ] || { echo "make ab_base first (see the header)"; exit 1; }
mkdir -p $OUT/k3 $OUT/h64
TREES=". ab_base" ROUNDS=2 OUT=$OUT/k3 bash experiments/h200/ab_call.sh > $OUT/k3_call.log 2>&1
TREES=". ab_base" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > $OUT/pytest_hopper_gpu.txt 2>&1
echo "pytest tests/test_moba_hopper.py -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_hopper_gpu.txt | tail -1))"
cat $OUT/k3/ptxas.txt $OUT/h64/ptxas.txt | grep -i fwd
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
