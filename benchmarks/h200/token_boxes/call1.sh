#!/usr/bin/env bash
# Device call 1 (2026-12-02, thirteenth session): 122f11f (a token's query heads of one KV group
# gathered as one box, the group's head count derived once) - its GPU test; beside cuDNN at the
# 0.5B model's shape (14/2 x 64, S=32K, block 256, k = 8 and 16) and at the headline point
# (16/16 x 128, block 512, top-3); the traced step at 14/2 x 64, block 512, top-3 against
# ecc173f's kernels (ab_base: `git archive ecc173f pallas_kernels experiments | tar -x -C
# ab_base`). The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
timeout 200 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 256 --ks 8 16 --heads h64 --out "$OUT/h64_b256.json" \
    > "$OUT/h64_b256.log" 2>&1
echo "bench_kernel h64 block 256: exit $?"
mkdir -p "$OUT/h64_b512"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" OUT="$OUT/h64_b512" \
    bash experiments/h200/ab_call.sh > "$OUT/h64_b512/call.log" 2>&1
echo "ab_call h64 block 512: exit $?"
timeout 120 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128 block 512: exit $?"
for f in h64_b256 h128_b512; do grep -vE "^\{" "$OUT/$f.log" | tail -8; done
tail -4 "$OUT/h64_b512/call.log"
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
