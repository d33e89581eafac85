#!/usr/bin/env bash
# Device call 3 (2026-12-02, sixteenth session): the kept code (bdc0334: the slot merge
# kernel's forward merge with its weights taken first) beside cuDNN, the README's rows:
# 16/16 x 128, block 512, k = 3, 8, 16; 14/2 x 64, block 256, k = 8, 16; 14/2 x 64, block 512,
# k = 3, 8, 16 (k_max = k; three processes, each with its own cuDNN reading). One tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
bench() {  # name timeout heads block ks...
  local name=$1 limit=$2 heads=$3 block=$4; shift 4
  timeout "$limit" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
      --seqs 32768 --blocks "$block" --ks "$@" --heads "$heads" --out "$OUT/$name.json" \
      > "$OUT/$name.log" 2>&1
  echo "bench_kernel $name: exit $?"
  grep -vE "^\{" "$OUT/$name.log" | tail -6
}
bench h128_b512 200 h128 512 3 8 16
bench h64_b256 150 h64 256 8 16
bench h64_b512 190 h64 512 3 8 16
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
