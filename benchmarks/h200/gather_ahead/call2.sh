#!/usr/bin/env bash
# Device call 2 (2026-12-02): the working tree (row ids read 8 ahead of their copies): its GPU
# tests and its step beside cuDNN at top-3 (16/16 x 128, one traced round first), then the
# traced step at 14/2 x 64 against HEAD's kernels (ab_base), one round each. The results come
# back in one tarball.
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="." ROUNDS=1 STEP=1 KS=3 OUT="$OUT/h128" bash experiments/h200/ab_call.sh 2>&1 \
    | tee "$OUT/h128/call.log" | tail -14
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh 2>&1 | tee "$OUT/h64/call.log" | tail -4
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
