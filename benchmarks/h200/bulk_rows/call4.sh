#!/usr/bin/env bash
# Device call 4 of the bulk row copies: the A/B that calls 1 and 2 missed (call 2's base tree was
# ignored by git through .git/info/exclude, so it did not travel): one round at 16/16 x 128,
# block 512, top-3, with ab_base given to the device call's carry (".whl", "ab_base");
#   git archive 59f9612 pallas_kernels experiments sparsebalance_jax | tar -x -C ab_base
# Usage on the device: bash benchmarks/h200/bulk_rows/call4.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
mkdir -p "$OUT/h128"
TREES="ab_base ." ROUNDS=1 OUT="$OUT/h128" bash experiments/h200/ab_call.sh > "$OUT/h128/call.log" 2>&1
echo "exit $?"
grep -A3 "per trace" "$OUT/h128/call.log"
pack_out
