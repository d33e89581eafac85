#!/usr/bin/env bash
# The gate over chunks against one chunk at S=64K, block 256, k = 8 and 32 (gate_tiles.py), on
# the machine call 3 left warm (the tree of call 3).
# Usage on the device: bash benchmarks/h200/ranks/call4.sh
set -uo pipefail
OUT=${OUT:?}
for k in 8 32; do
  timeout 70 python3 experiments/gate_tiles.py --seq 65536 --block 256 --k $k --heads h128 \
      --configs 128,8 32,4,256 128,4 --out $OUT/gate_65536_256_k$k.json \
      > $OUT/gate_65536_256_k$k.log 2>&1
  echo "k=$k exit $?"; tail -4 $OUT/gate_65536_256_k$k.log
done
