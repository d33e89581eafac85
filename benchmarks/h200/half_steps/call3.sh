#!/usr/bin/env bash
# Device call 3 (2026-12-02, fifteenth session): the working tree - half steps (forward and
# dk/dv wherever ping-pong is off, dq at head_dim 128) and the slot merge kernel's new tiles
# (16 tokens, 2 warps, after call 2) - against 6890eac's kernels (ab_base), in the traced
# step where the merge kernel runs (k_max >= 8) at 14/2 x 64, block 256, top-8 (one round);
# then the working tree beside cuDNN at
# 14/2 x 64, block 256, k = 8 and 16 (the session's device time left no room for its GPU test
# again: call 1 ran it on these forward and dk/dv kernels, and call 2 checked the merge's new
# tiles equal to its old ones on the GPU). The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
for point in "h64 256 8"; do
  set -- $point
  dir="$OUT/$1_$2_$3"
  mkdir -p "$dir"
  TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads $1 --block $2 --k $3" OUT="$dir" \
      bash experiments/h200/ab_call.sh > "$dir/call.log" 2>&1
  echo "ab_call $point: exit $?"
  tail -2 "$dir/call.log"
done
timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 256 --ks 8 16 --heads h64 --out "$OUT/h64_b256.json" > "$OUT/h64_b256.log" 2>&1
echo "bench_kernel h64: exit $?"
grep -vE "^\{" "$OUT/h64_b256.log" | tail -5
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
