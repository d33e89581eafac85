#!/usr/bin/env bash
# Device call 5 (ninth 2026-12-01 session): part of each tile's softmax exponentials on the FMA
# units (hopper.common._exp2, POLY_EXP2_SHARE of the columns by a polynomial, the rest by
# ex2.approx) in the forward, dq and dk/dv kernels: `git apply benchmarks/h200/layout/poly_exp2.patch`
# on 7cdce6b (run once; not kept). Trees: the working tree (share 0.25),
# ab_s50 (the same with share 0.5) and ab_base (7cdce6b: every exponential by ex2.approx);
# the step's GPU time at 14/2 x 64 and 16/16 x 128, top-3, block 512, two rounds each; then the
# compiled Hopper kernels' GPU test on the working tree. Before the call, on this machine:
#   mkdir ab_base && git archive 7cdce6b pallas_kernels experiments | tar -x -C ab_base
#   mkdir ab_s50 && cp -r pallas_kernels experiments ab_s50/ &&
#     sed -i 's/^POLY_EXP2_SHARE = 0.25$/POLY_EXP2_SHARE = 0.5/' ab_s50/pallas_kernels/moba/hopper/common.py
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
for t in ab_base ab_s50; do [ -d $t ] || { echo "make $t first (see the header)"; exit 1; }; done
mkdir -p $OUT/h64 $OUT/h128
TREES=". ab_base ab_s50" ROUNDS=2 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
TREES=". ab_base ab_s50" ROUNDS=2 OUT=$OUT/h128 bash experiments/h200/ab_call.sh \
    > $OUT/h128_call.log 2>&1
timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > $OUT/pytest_hopper_gpu.txt 2>&1
echo "pytest tests/test_moba_hopper.py -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_hopper_gpu.txt | tail -1))"
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
