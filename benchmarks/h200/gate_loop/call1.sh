#!/usr/bin/env bash
# Device call 1 (2026-12-02, fourteenth session): the gate's top-k kernel running several token
# tiles per program in a software-pipelined loop (moba_gate_topk's tiles_per_program and
# num_stages; configs "tile,num_warps,tiles_per_program,num_stages", the first of each point
# the default, against which every other's picks are checked), alone, back to back, at the
# three points the step is read at: 16/16 x 128, block 512, k_max 3 and 16; 14/2 x 64, block
# 256, k_max 8. It ran on 5019850 with `tiles_per_program.patch` (beside this script) applied:
# the kernel's loop, its test and gate_tiles.py's longer configs; not kept (BENCHMARKS.md).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
gate() {  # tag, point args, configs...
  local tag=$1 point=$2
  shift 2
  # shellcheck disable=SC2086
  timeout 200 python3 experiments/gate_tiles.py $point --configs "$@" \
      --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
  echo "$tag: exit $?"
}
gate h128_k3 "--heads h128 --block 512 --k 3" 128,8 128,8,2,2 128,8,4,2 128,8,8,2 \
    128,8,16,2 128,8,4,3 128,8,8,3 128,4,4,2 64,4,8,2 128,8
gate h128_k16 "--heads h128 --block 512 --k 16" 128,8 128,8,4,2 128,8,8,2 128,8,4,3
gate h64_k8 "--heads h64 --block 256 --k 8" 64,4 64,4,4,2 64,4,8,2 64,4,16,2 64,8,8,2 \
    64,4,8,3
for tag in h128_k3 h128_k16 h64_k8; do
  echo "== $tag"
  tail -n 12 "$OUT/$tag.log" | sed -n '/tile,warps/,$p'
done
