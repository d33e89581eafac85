#!/usr/bin/env bash
# Device call 1: what XLA's command-buffer settings do to a synchronised call of the MoBA step
# (16/16 x 128, S=32K, block 512, top-3) and of a plain two-matmul program of its length:
# experiments/call_overhead.py --long (wall, span on the GPU's clock, host = wall - span, median
# of 30 synchronised calls; back to back) once per XLA_FLAGS setting, each in its own process.
# Usage on the device: bash benchmarks/h200/xla_flags/call1.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
run() {  # run NAME FLAGS...
  local name=$1
  shift
  XLA_FLAGS="$*" timeout 100 python3 -m experiments.call_overhead --long --skip-small \
      --programs matmul2 moba --calls 30 --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name ($*): exit $?"
  grep '^{' "$OUT/$name.log"
}
run default
run serialize --xla_gpu_command_buffer_scheduling_mode=SERIALIZE
run concurrent --xla_gpu_command_buffer_scheduling_mode=CONCURRENT
run regions --xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS
run always_update --xla_gpu_command_buffer_update_mode=ALWAYS_UPDATE
run skip_temp --xla_gpu_command_buffer_update_mode=SKIP_TEMP
run skip_profiled --xla_gpu_command_buffer_update_mode=SKIP_PROFILED
run default_again
