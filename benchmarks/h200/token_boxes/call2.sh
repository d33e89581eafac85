#!/usr/bin/env bash
# Device call 2 (2026-12-02, thirteenth session): the forward's and dq's streams in a module of
# their own (hopper/streams.py; the working tree) - its GPU test; the traced step at 16/16 x
# 128, block 512, top-3 against the same tree with the forward's overlapped schedule (ab_fov:
# the working tree with moba_forward_rows' overlap default True; one change, made in the copy);
# then the working tree beside cuDNN at S=64K, block 512, k = 3, 8, 16, 16/16 x 128. The
# results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
mkdir -p "$OUT/h128"
TREES=". ab_fov" ROUNDS=2 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
timeout 240 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 65536 --blocks 512 --ks 3 8 16 --heads h128 --out "$OUT/h128_s64k.json" \
    > "$OUT/h128_s64k.log" 2>&1
echo "bench_kernel h128 S=64K: exit $?"
grep -vE "^\{" "$OUT/h128_s64k.log" | tail -7
tail -5 "$OUT/h128/call.log"
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
