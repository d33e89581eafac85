#!/usr/bin/env bash
# Device call 2: XLA's CONCURRENT command-buffer scheduling against the default, by the step's
# traced kernels (trace_moba.py: GPU span and its idle part from the profiler's timestamps,
# which the clock readings of call 1 cannot give where kernels may overlap), two rounds in
# alternating processes; the Hopper GPU tests under CONCURRENT; bench_kernel.py beside cuDNN
# under each (16/16 x 128, S=32K, block 512, top-3).
# Usage on the device: bash benchmarks/h200/xla_flags/call2.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
export PYTHONUNBUFFERED=1
CONC=--xla_gpu_command_buffer_scheduling_mode=CONCURRENT
for r in 1 2; do
  for mode in default concurrent; do
    flags=""
    [ "$mode" = concurrent ] && flags=$CONC
    XLA_FLAGS="$flags" timeout 120 python3 experiments/trace_moba.py --heads h128 --block 512 \
        --k 3 --backend mosaic --reps 10 --out "$OUT/trace_${mode}_$r.json" \
        > "$OUT/trace_${mode}_$r.log" 2>&1
    echo "trace $mode $r: exit $?"
  done
done
python3 experiments/h200/trace_table.py "$OUT"/trace_*.json
XLA_FLAGS=$CONC gpu_tests 120 tests/test_moba_hopper.py -m gpu
for mode in concurrent default; do
  flags=""
  [ "$mode" = concurrent ] && flags=$CONC
  XLA_FLAGS="$flags" timeout 120 python3 experiments/bench_kernel.py --skip-check \
      --backends mosaic --seqs 32768 --blocks 512 --ks 3 --heads h128 \
      --out "$OUT/bench_$mode.json" > "$OUT/bench_$mode.log" 2>&1
  echo "bench $mode: exit $?"
  grep -A3 "^kind " "$OUT/bench_$mode.log"
done
pack_out
