#!/usr/bin/env bash
# Device call 5 of the bulk row copies: call 4's A/B in two rounds at 16/16 x 128, block 512,
# top-3, and one at 14/2 x 64, block 256, top-8 (ab_base as in call4.sh, carried).
# Usage on the device: bash benchmarks/h200/bulk_rows/call5.sh
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="ab_base ." ROUNDS=2 OUT="$OUT/h128" bash experiments/h200/ab_call.sh > "$OUT/h128/call.log" 2>&1
echo "exit $?"
grep -A5 "per trace" "$OUT/h128/call.log"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "exit $?"
grep -A3 "per trace" "$OUT/h64/call.log"
tar -czf /tmp/r.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/r.tgz "$OUT/"
