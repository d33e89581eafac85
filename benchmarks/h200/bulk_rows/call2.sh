#!/usr/bin/env bash
# Device call 2 of the bulk row copies: call 1's A/B again with a base tree that runs (call 1's
# ab_base lacked sparsebalance_jax, which bench_kernel.py imports:
#   git archive 59f9612 pallas_kernels experiments sparsebalance_jax | tar -x -C ab_base),
# one round at 16/16 x 128, block 512, top-3 (its base did not run: ab_base, listed in
# .git/info/exclude, was ignored by git and so not copied to the device; calls 4 and 5 carried
# it); then issue 3's grid cells not reached before, with the working tree's kernels: 14/2 x 64,
# S=64K, block 256, k = 2, 4, 8, 16, 32 (k_max = k), cuDNN timed in the same process.
# Usage on the device: bash benchmarks/h200/bulk_rows/call2.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/h128"
TREES="ab_base ." ROUNDS=1 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
grep -A3 "per trace" "$OUT/h128/call.log"
SEQ=65536 HEADS=h64 BLOCKS=256 KS="2 4 8 16 32" LIMIT=390 bash benchmarks/h200/grid2/call.sh
pack_out
