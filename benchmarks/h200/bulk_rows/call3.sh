#!/usr/bin/env bash
# Issue 3's grid, the last cells not reached before, with the working tree's kernels: 14/2 x 64,
# S=64K, block 512, k = 2, 4, 32, and S=8K, block 256, k = 32 (k_max = k), cuDNN timed in each
# process.
# Usage on the device: bash benchmarks/h200/bulk_rows/call3.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
SEQ=65536 HEADS=h64 BLOCKS=512 KS="2 4 32" LIMIT=250 bash benchmarks/h200/grid2/call.sh
SEQ=8192 HEADS=h64 BLOCKS=256 KS=32 LIMIT=90 bash benchmarks/h200/grid2/call.sh
pack_out
