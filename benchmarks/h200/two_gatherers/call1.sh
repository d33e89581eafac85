#!/usr/bin/env bash
# Device call 1 of the two row gatherers (2026-12-02, fourteenth session): the forward's and
# dq's rows gathered by two warpgroups, one per half of an item (the working tree: five
# warpgroups, the compute ones at 200 registers; each gatherer's half read from its warpgroup
# index, which call 2 made static) against one gatherer for both halves
# (ab_base: `git archive 5019850 pallas_kernels experiments | tar -x -C ab_base`): the working
# tree's GPU test, the traced step at 16/16 x 128, block 512, top-3 (two rounds) and at
# 14/2 x 64, block 256, top-8 (two rounds), then the working tree beside cuDNN at 16/16 x 128,
# block 512, top-3 and at 14/2 x 64, block 256, top-8.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="ab_base ." ROUNDS=2 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
TREES="ab_base ." ROUNDS=2 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "ab_call h64: exit $?"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128: exit $?"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 256 --ks 8 --heads h64 --out "$OUT/h64_b256.json" \
    > "$OUT/h64_b256.log" 2>&1
echo "bench_kernel h64: exit $?"
for f in h128_b512 h64_b256; do grep -vE "^\{" "$OUT/$f.log" | tail -4; done
for d in h128 h64; do cat "$OUT/$d/ptxas.txt"; tail -6 "$OUT/$d/call.log"; done
