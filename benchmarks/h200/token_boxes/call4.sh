#!/usr/bin/env bash
# Device call 4 (2026-12-02, thirteenth session): dq reading its rows' segment and position
# from global memory, with a fourth K stage at head_dim 128 in the room that leaves (the
# working tree) against afa506d's kernels (ab_base: `git archive afa506d pallas_kernels
# experiments | tar -x -C ab_base`): the traced step at 16/16 x 128, block 512, top-3, one
# round each, then the working tree's GPU test. Results are written as they come (no tarball:
# the session's device time ends near this call's end).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
TREES="ab_base ." ROUNDS=1 OUT="$OUT" bash experiments/h200/ab_call.sh > "$OUT/call.log" 2>&1
echo "ab_call h128: exit $?"
tail -3 "$OUT/call.log"
grep -h "ptxas" "$OUT/ptxas.txt" | grep dq
timeout 110 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
