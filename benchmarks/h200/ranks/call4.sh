#!/usr/bin/env bash
# The gate over chunks against one chunk at S=64K, block 256, k = 8 and 32 (gate_tiles.py), on
# the machine call 3 left warm (the tree of call 3).
# Usage on the device: bash benchmarks/h200/ranks/call4.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
for k in 8 32; do
  gate_tiles 70 65536 256 $k 128,8 32,4,256 128,4
done
