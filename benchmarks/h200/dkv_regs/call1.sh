#!/usr/bin/env bash
# Device call 1 (2026-12-02, fourteenth session): dk/dv's compute warpgroups at 240 registers
# and its producer at 24 below head_dim 128 only (the working tree; at 128 they keep 232 and
# 40) against 1ec95fc's kernels (ab_base: `git archive 1ec95fc pallas_kernels experiments |
# tar -x -C ab_base`), a second reading of the thirteenth session's -1.1% at 14/2 x 64: the
# traced step at 14/2 x 64, block 256, top-8, two rounds, then the working tree's GPU test.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
TREES="ab_base ." ROUNDS=2 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT" \
    bash experiments/h200/ab_call.sh > "$OUT/call.log" 2>&1
echo "ab_call h64: exit $?"
cat "$OUT/ptxas.txt"; tail -5 "$OUT/call.log"
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
