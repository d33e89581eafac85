#!/usr/bin/env bash
# Every GPU-marked test at the current tree (the gate over chunks with its final defaults: 8
# picks at most, 4 warps, chunks past 512 blocks at any k); then the step beside cuDNN at
# S=64K, block 256, k = 8, 16, 32 (16/16 x 128), which the gate's default now runs in one
# pass past 8 picks, and the headline point (S=32K, block 512, top-3) again.
# Usage on the device: bash benchmarks/h200/grid3/call1.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
source experiments/h200/lib.sh
gpu_tests 230 tests -m gpu --ignore=tests/test_notebook.py || exit 1
for point in "65536 256 8 16 32" "32768 512 3"; do
  set -- $point
  t0=$(date +%s)
  timeout 170 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
      --seqs "$1" --blocks "$2" --ks "${@:3}" --heads h128 --out "$OUT/h128_$1_b$2.json" \
      > "$OUT/h128_$1_b$2.log" 2>&1
  echo "bench_kernel $1 $2: exit $? after $(( $(date +%s) - t0 )) s"
  grep -vE "^\{" "$OUT/h128_$1_b$2.log" | tail -8
done
tar czf /tmp/call1.tgz -C "$OUT" . && rm -f "$OUT"/* && mv /tmp/call1.tgz "$OUT"/
