#!/usr/bin/env bash
# Device call 3 (2026-12-02, thirteenth session): dk/dv's compute warpgroups at 240 registers
# (its one streaming warpgroup at 24, where it kept 40 and they 232; the working tree) against
# 5148703's kernels (ab_base: `git archive 5148703 pallas_kernels experiments | tar -x -C
# ab_base`) and the working tree with the forward's first key step of each item peeled off,
# its output's correction skipped (ab_r0: the output so far is zero there; `ab_r0.patch`):
# the working tree's GPU test, the traced step at 16/16 x 128 (two rounds, every kernel's PTX
# kept) and at 14/2 x 64 (block 512, top-3, one round), then the working tree beside cuDNN at
# the headline point. The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="ab_base . ab_r0" ROUNDS=2 PTX=1 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
TREES="ab_base . ab_r0" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "ab_call h64: exit $?"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128: exit $?"
grep -vE "^\{" "$OUT/h128_b512.log" | tail -4
for d in h128 h64; do cat "$OUT/$d/ptxas.txt"; tail -4 "$OUT/$d/call.log"; done
gzip "$OUT"/h128/ptx/*.ptx 2>/dev/null
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
