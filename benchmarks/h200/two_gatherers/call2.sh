#!/usr/bin/env bash
# Device call 2 of the two row gatherers (2026-12-02, fourteenth session): as call 1, with each
# gathering warpgroup's half static (call 1's took it from the warpgroup index, and ptxas
# spilled the gatherers' addresses at their 24 registers). The traced step at 16/16 x 128,
# block 512, top-3 (two rounds, every kernel's PTX kept) and at 14/2 x 64, block 256, top-8
# (one round), the working tree beside cuDNN at 16/16 x 128, block 512, top-3, then its GPU
# test. The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="ab_base ." ROUNDS=2 PTX=1 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
cat "$OUT/h128/ptxas.txt"; tail -4 "$OUT/h128/call.log"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "ab_call h64: exit $?"
tail -2 "$OUT/h64/call.log"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128: exit $?"
grep -vE "^\{" "$OUT/h128_b512.log" | tail -4
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
gzip "$OUT"/h128/ptx/*.ptx 2>/dev/null
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
