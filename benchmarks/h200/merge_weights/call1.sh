#!/usr/bin/env bash
# Device call 1 (2026-12-02, sixteenth session): the slot merge kernel's forward merge reads
# every used slot's lse first and turns them into final weights, so that its loop over the
# slots only loads rows and adds, as dq's (the working tree), against d28de0b's running
# maximum and rescale per slot (ab_base: `git archive d28de0b pallas_kernels experiments | tar
# -x -C ab_base`) and a variant that also takes each slot's rows from that first gather
# (ab_rows). experiments/merge_tiles.py at 14/2 x 64, block 256, k = 8 and 16, and 16/16 x 128,
# block 512, k = 16 and 3; then the traced step at 14/2 x 64, block 256, top-8 (working tree
# against ab_base, one round), and the working tree's step at 16/16 x 128, block 512, top-3
# with its optimized HLO (where the step's XLA fusions come from). One tarball comes back.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
merge() {  # tree heads block k
  local tag; tag=$(basename "$(realpath "$1")"); [ "$1" = . ] && tag=work
  timeout 90 python3 "$1/experiments/merge_tiles.py" --heads "$2" --block "$3" --k "$4" \
      --configs 16,2,3 32,4,2 64,4,1 --out "$OUT/merge_${tag}_$2_$3_$4.json" \
      > "$OUT/merge_${tag}_$2_$3_$4.log" 2>&1
  echo "== merge_tiles $tag $2 $3 $4: exit $?"
  tail -8 "$OUT/merge_${tag}_$2_$3_$4.log"
}
for tree in ab_base . ab_rows; do merge "$tree" h64 256 8; done
for tree in ab_base .; do merge "$tree" h64 256 16; done
for tree in ab_base . ab_rows; do merge "$tree" h128 512 16; done
mkdir -p "$OUT/h64" "$OUT/h128"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "ab_call h64: exit $?"
tail -4 "$OUT/h64/call.log"
TREES="." ROUNDS=1 HLO=1 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128 (HLO): exit $?"
tail -3 "$OUT/h128/call.log"
for tree in ab_base .; do merge "$tree" h128 512 3; done
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
