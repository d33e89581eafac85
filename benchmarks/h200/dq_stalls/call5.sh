#!/usr/bin/env bash
# Device call 5 (2026-12-02): the PTX of the forward kernel under the overlapped schedules
# (overlap with and without ping-pong) and the default one, at 16/16 x 128 (S=32K, block 512,
# top-3), for sass_lines.py: where the overlapped steps' extra cycles outside every profiled
# region (call 4) come from. One process per schedule, each kernel run once.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
for sched in 0,0 1,0 1,1; do
  dir=/tmp/dump_${sched/,/_}
  mkdir -p "$dir"
  MOSAIC_GPU_DUMP_TO=$dir MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 \
      python3 experiments/profile_hopper.py --plain --kernels forward --forward-schedule "$sched" \
      > "/tmp/run_${sched/,/_}.log" 2>&1
  echo "forward $sched: exit $?"
  cp "$dir"/moba_fwd_hopper*.ptx "$OUT/fwd_${sched/,/_}.ptx"
  grep -hE "Used [0-9]+ registers|spill|C75" "$dir"/moba_fwd_hopper*.ptxas | sort -u | head -8
done
tar -czf /tmp/ptx.tgz -C "$OUT" . && rm -f "$OUT"/*.ptx && mv /tmp/ptx.tgz "$OUT/"
