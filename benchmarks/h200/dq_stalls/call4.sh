#!/usr/bin/env bash
# Device call 4 (2026-12-02): where the forward's warpgroups spend an item's cycles under each
# schedule of the tensor-core turns at 16/16 x 128 (S=32K, block 512, top-3): the default
# (plain, no ping-pong), ping-pong, and ping-pong with the overlapped steps (FlashAttention-3's
# schedule), each slower in the step in earlier sessions; and dq at its default pipeline
# (64-key tiles, 3 K / 2 V stages, with 200 profiler events where 300 do not fit), where the
# tenth session's profile ran it with two K stages.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
run() {  # name, profile_hopper.py arguments
  local name=$1; shift
  timeout 150 python3 experiments/profile_hopper.py --heads h128 --block 512 --k 3 "$@" \
      --out "$OUT/prof_$name.json" > "/tmp/prof_$name.log" 2>&1
  echo "== $name: exit $?"
  grep -E "^(forward|dq) .*wg[01]:|error" "/tmp/prof_$name.log" | cut -c1-400
}
run fwd_default --kernels forward
run fwd_pingpong --kernels forward --forward-schedule 0,1
run fwd_overlap_pingpong --kernels forward --forward-schedule 1,1
run dq_default --kernels dq --dq-config 64,3,2 --events 200
