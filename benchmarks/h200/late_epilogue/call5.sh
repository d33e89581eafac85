#!/usr/bin/env bash
# Device call 5 (2026-12-01, tenth session): the forward at head_dim 64 on the overlapped
# schedule (each step's q K^T issued with the previous step's P V, the softmax under that
# P V), with P V's P from a shared-memory tile per compute warpgroup (the working tree's new
# default below head_dim 128) or from registers (ab_regs: the same tree with p_via_smem off),
# against ab_base (HEAD: no overlap at any head_dim): the traced step at 14/2 x 64 top-3, two
# rounds, every ptxas message in full; then the Hopper GPU tests on the working tree.
# Before the call, on this machine:
#   mkdir ab_base && git archive HEAD pallas_kernels experiments | tar -x -C ab_base
#   ab_regs: a copy of the working tree's pallas_kernels/ and experiments/ whose
#   moba_forward_rows takes p_via_smem=None as False
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
[ -d ab_base ] && [ -d ab_regs ] || { echo "make ab_base and ab_regs first (see the header)"; exit 1; }
mkdir -p $OUT/h64
TREES=". ab_regs ab_base" ROUNDS=2 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
python3 experiments/h200/trace_table.py $OUT/h64/trace_*.json
grep -i fwd $OUT/h64/ptxas.txt; grep -i fwd $OUT/h64/ptxas_messages.txt | cut -c1-220
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > $OUT/pytest_hopper_gpu.txt 2>&1
echo "pytest tests/test_moba_hopper.py -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_hopper_gpu.txt | tail -1))"
