#!/usr/bin/env bash
# Device call 1 (2026-12-02): the row gatherer reading its row ids ahead of their copies
# (the working tree: 8 at a time; ab_16: 16) against HEAD's kernels (ab_base: `git archive
# HEAD pallas_kernels experiments | tar -x -C ab_base`): the traced step at 16/16 x 128, two
# rounds each, with every kernel's PTX kept. The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT/h128"
TREES="ab_base ab_16 ." ROUNDS=2 PTX=1 OUT="$OUT/h128" bash experiments/h200/ab_call.sh 2>&1 \
    | tee "$OUT/h128/call.log" | tail -30
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
