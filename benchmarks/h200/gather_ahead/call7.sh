#!/usr/bin/env bash
# Device call 7 (2026-12-02): a token's query heads (7 a KV group at 14/2) gathered as one box
# (the working tree) against one copy per row (HEAD's kernels, ab_base: `git archive HEAD
# pallas_kernels experiments | tar -x -C ab_base`): the traced step at 14/2 x 64, block 256,
# top-8, one round each; then the working tree's GPU test. The results come back in one
# tarball.
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT/h64_b256"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64_b256" \
    bash experiments/h200/ab_call.sh 2>&1 | tee "$OUT/h64_b256/call.log" | tail -6
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
