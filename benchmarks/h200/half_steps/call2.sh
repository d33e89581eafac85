#!/usr/bin/env bash
# Device call 2 (2026-12-02, fifteenth session): dq's half steps at 14/2 x 64, where call 1
# read dq 0.849 -> 0.865 ms with them. The working tree now keeps them off in dq below
# head_dim 128; ab_on = the working tree with them on there too (its moba_dq_rows default
# `half_steps = not pingpong`), ab_base = 6890eac's kernels. The traced step at 14/2 x 64,
# block 256, top-8 (two rounds; at 16/16 x 128 the working tree's kernels are call 1's). Then
# the slot merge kernel alone (experiments/merge_tiles.py) at 14/2 x 64,
# block 256, k = 8 and 16, and 16/16 x 128, block 512, k = 16, for several token tiles, warp
# counts and pipeline depths, beside XLA's merge. The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/h64"
TREES="ab_base ab_on ." ROUNDS=2 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "ab_call h64: exit $?"
cat "$OUT/h64/ptxas.txt"; tail -7 "$OUT/h64/call.log"
for point in "h64 256 8" "h64 256 16" "h128 512 16"; do
  set -- $point
  timeout 120 python3 experiments/merge_tiles.py --heads "$1" --block "$2" --k "$3" \
      --configs 64,4,1 64,4,2 64,4,3 32,4,2 32,2,3 128,4,2 128,8,3 16,2,3 \
      --out "$OUT/merge_$1_$2_$3.json" > "$OUT/merge_$1_$2_$3.log" 2>&1
  echo "merge_tiles $point: exit $?"
  tail -19 "$OUT/merge_$1_$2_$3.log"
done
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
