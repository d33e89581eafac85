#!/usr/bin/env bash
# Device call 3 (prepared in the eighth 2026-12-01 session, not yet run: no machine was lent
# after call 2). The layout's read ranks counted by a small kernel of their own
# (kernels.moba_read_ranks: 32 tokens a program, 48 registers per thread at k_max 3 compiled
# on the CPU), leaving the gate kernel as it is, against the committed code. Before the call,
# on this machine:
#   git apply benchmarks/h200/layout/read_ranks_kernel.patch
#   mkdir ab_base && git archive HEAD pallas_kernels experiments | tar -x -C ab_base
# then `bash benchmarks/h200/layout/call3.sh` on the device (after installing .whl/). Adopt the
# patch if the step's kernels fall at 16/16 x 128 under k_max 3 and 16 and do not rise at 14/2
# x 64 (call 2: the XLA ranks it replaces cost 0.086 / 0.097 / 0.015 ms there).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
[ -d ab_base ] || { echo "make ab_base first (see the header)"; exit 1; }
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
