#!/usr/bin/env bash
# Device call 1 (2026-12-02, fifteenth session): each compute warpgroup runs only its own
# half's key steps (forward, dq: an own-block half stops after its last query's key tile) or
# chunk steps (dk/dv: from the first chunk holding a row at or after its 64 keys) wherever
# the warpgroups do not take ping-pong turns (the working tree), against 6890eac's kernels
# (ab_base: `git archive 6890eac pallas_kernels experiments | tar -x -C ab_base`). The traced
# step at 16/16 x 128, block 512, top-3 (two rounds) and at 14/2 x 64, block 256, top-8 (one
# round), the working tree beside cuDNN at 16/16 x 128, block 512, top-3, then its GPU test.
# The results come back in one tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/h128" "$OUT/h64"
TREES="ab_base ." ROUNDS=2 OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
    > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
cat "$OUT/h128/ptxas.txt"; tail -5 "$OUT/h128/call.log"
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
    bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
echo "ab_call h64: exit $?"
tail -3 "$OUT/h64/call.log"
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128: exit $?"
grep -vE "^\{" "$OUT/h128_b512.log" | tail -4
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
