#!/usr/bin/env bash
# Device call 6 (2026-12-02): the row ids read ahead (the working tree, HEAD) against the kernels
# before it (ab_base: `git archive e68cffb pallas_kernels experiments | tar -x -C ab_base`) at
# the 0.5B model's shape, block 256, top-8 (14/2 x 64, S=32K), whose two-step items lean on
# the gatherer more than block 512's: the traced step, two rounds each.
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT/h64_b256"
TREES="ab_base ." ROUNDS=2 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64_b256" \
    bash experiments/h200/ab_call.sh 2>&1 | tee "$OUT/h64_b256/call.log" | tail -6
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
