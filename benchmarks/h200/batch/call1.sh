#!/usr/bin/env bash
# Device call 1: the top-3 point (S=32K, block 512, k = k_max = 3) at the training loop's batch
# of two 32K rows beside one row, cuDNN at the same batch in the same process
# (bench_kernel.py --batch), 16/16 x 128 and 14/2 x 64 (the GPU preset's heads); then the traced
# step at two rows (trace_moba.py --batch 2) for where its GPU time goes.
# Usage on the device: bash benchmarks/h200/batch/call1.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
bench() {  # bench NAME BATCH HEADS...
  local name=$1 batch=$2
  shift 2
  timeout 240 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
      --blocks 512 --ks 3 --heads "$@" --batch "$batch" --out "$OUT/$name.json" \
      > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"
  sed -n '/^batch /,$p' "$OUT/$name.log"
}
bench b1_h128 1 h128
bench b2 2 h128 h64
bench b1_h128_again 1 h128
timeout 150 python3 experiments/trace_moba.py --backend mosaic --batch 2 \
    --out "$OUT/trace_b2_h128.json" > "$OUT/trace_b2_h128.log" 2>&1
echo "trace b2 h128: exit $?"
tail -25 "$OUT/trace_b2_h128.log"
