#!/usr/bin/env bash
# Device call 3 (2026-12-02): with the row ids read ahead (HEAD's kernels, ab_base: `git
# archive HEAD pallas_kernels experiments | tar -x -C ab_base`), the forward's and dq's item
# list with the blocks' own rows last again (the working tree: HEAD plus
# dq_stalls/own_items_last.patch): the traced step at 16/16 x 128, two rounds each; then the
# on-chip profile of HEAD's forward (where an item's cycles go, the gatherer's among them).
# The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/h128"
TREES="ab_base ." ROUNDS=2 OUT="$OUT/h128" bash experiments/h200/ab_call.sh 2>&1 \
    | tee "$OUT/h128/call.log" | tail -8
timeout 150 python3 ab_base/experiments/profile_hopper.py --heads h128 --block 512 --k 3 \
    --kernels forward --out "$OUT/prof_base.json" \
    > "$OUT/prof_base.log" 2>&1
echo "== profile: exit $?"
grep -E "^forward|error" "$OUT/prof_base.log" | cut -c1-400
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
