#!/usr/bin/env bash
# Device call 2 (2026-12-01, tenth session). Call 1's change stored the forward's output
# through the plain staging buffer (bank conflicts: 8 rows of a wgmma tile share banks) and
# ptxas reported C7517 on it. Here the working tree stores it through a swizzled view of each
# half's staging buffer (RefUnion), normalized at the item's end and carried, under the next
# item's first q K^T; ab_pre = the same with that store before the q K^T is issued (the
# window's part isolated); ab_base = HEAD's kernels. Traced step at 16/16 x 128 top-3 (two
# rounds) and 14/2 x 64 (one), every ptxas message in full, then the Hopper GPU tests.
# Before the call, on this machine:
#   mkdir ab_base && git archive HEAD pallas_kernels experiments | tar -x -C ab_base
#   ab_pre: a copy of the working tree's pallas_kernels/ and experiments/ with qk's
#   `meanwhile()` moved ahead of its wait_turn() (pallas_kernels/moba/hopper/rows.py)
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
[ -d ab_base ] && [ -d ab_pre ] || { echo "make ab_base and ab_pre first (see the header)"; exit 1; }
mkdir -p $OUT/k3 $OUT/h64
TREES=". ab_pre ab_base" ROUNDS=2 OUT=$OUT/k3 bash experiments/h200/ab_call.sh > $OUT/k3_call.log 2>&1
TREES=". ab_pre ab_base" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > $OUT/pytest_hopper_gpu.txt 2>&1
echo "pytest tests/test_moba_hopper.py -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_hopper_gpu.txt | tail -1))"
cat $OUT/k3/ptxas_messages.txt $OUT/h64/ptxas_messages.txt | grep -i fwd | cut -c1-300
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
