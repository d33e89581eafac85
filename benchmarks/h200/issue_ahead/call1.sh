#!/usr/bin/env bash
# Device call 1, two forward changes at head_dim 128 and both together, four trees (carried):
# ab_base = HEAD's kernels; ab_ahead = the rotated loop without ping-pong (each warpgroup
# free-running, as the kept schedule, with half_steps: a key step's softmax, then its P V and
# the next step's q K^T issued back to back and waited for once); ab_early = HEAD with an
# unmasked step's K slot freed as soon as S is in hand (not after the softmax); "." = both.
# The Hopper GPU tests on the working tree, the traced A/B (two rounds, PTX kept) at the
# top-3 point, and the working tree beside cuDNN there.
# Usage on the device: bash benchmarks/h200/issue_ahead/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 150 tests/test_moba_hopper.py -m gpu
mkdir -p "$OUT/h128"
TREES="ab_base ab_ahead ab_early ." ROUNDS=2 PTX=1 OUT="$OUT/h128" \
    bash experiments/h200/ab_call.sh > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
cat "$OUT/h128/ptxas.txt"
sed -n '/per trace/,$p' "$OUT/h128/call.log"
bench_top3
pack_out
