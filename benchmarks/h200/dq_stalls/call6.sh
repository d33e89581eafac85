#!/usr/bin/env bash
# Device call 6 (2026-12-02): the forward's and dq's item list in two passes - other blocks'
# readers first, the blocks' own rows last (the working tree) - against HEAD's kernels
# (ab_base: `git archive HEAD pallas_kernels experiments | tar -x -C ab_base`): the traced step
# at 16/16 x 128 (two rounds each, then the GPU tests and the time beside cuDNN at top-3, both
# on the working tree), and at 14/2 x 64 (one round each). The results come back in one
# tarball.
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="ab_base ." ROUNDS=2 STEP=1 KS=3 OUT="$OUT/h128" bash experiments/h200/ab_call.sh 2>&1 \
    | tee "$OUT/h128/call.log" | tail -22
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh 2>&1 | tee "$OUT/h64/call.log" | tail -4
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
