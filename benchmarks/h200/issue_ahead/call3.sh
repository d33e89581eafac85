#!/usr/bin/env bash
# Device call 3: the forward's key tiles of 256 keys below head_dim 128 (the same tile bytes as
# 128 keys at head_dim 128; at block 256 one key step per item, at block 512 two). The Hopper
# GPU test (14/2 x 64 and 4/4 x 128, block 256, against the reference) on the working tree, then
# the traced A/B against ab_base (HEAD before it, carried) at 14/2 x 64: block 512 top-3 (two
# rounds) and block 256 top-8 (one).
# Usage on the device: bash benchmarks/h200/issue_ahead/call3.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 150 tests/test_moba_hopper.py -m gpu
for point in "512 3 2" "256 8 1"; do
  read -r block k rounds <<< "$point"
  mkdir -p "$OUT/b$block"
  TREES="ab_base ." ROUNDS=$rounds TRACE_ARGS="--heads h64 --block $block --k $k" \
      OUT="$OUT/b$block" bash experiments/h200/ab_call.sh > "$OUT/b$block/call.log" 2>&1
  echo "ab_call h64 block $block k=$k: exit $?"
  cat "$OUT/b$block/ptxas.txt"
  sed -n '/per trace/,$p' "$OUT/b$block/call.log"
done
pack_out
