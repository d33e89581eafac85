#!/usr/bin/env bash
# Device call 1 of the bulk row copies (2026-12-03, twenty-second session): the streams' copies of
# contiguous in-bounds slices into plain buffers (the gathered rows, their ids, segments and
# positions, the key segments) as bulk copies from a pointer (oob_mode PROMISE_IN_BOUNDS) in
# place of tensor copies through a TMA descriptor. ab_base = the kernels before it:
#   git archive 59f9612 pallas_kernels experiments | tar -x -C ab_base
# (that base lacked sparsebalance_jax, which bench_kernel.py imports: both of its traces failed
# to start, see call2.sh)
# The traced step at 16/16 x 128, block 512, top-3 (two rounds, every kernel's PTX kept) and at
# 14/2 x 64, block 256, top-8 (one round), the Hopper GPU tests, then the working tree beside
# cuDNN at the headline point. The results come back in one tarball.
# Usage on the device: bash benchmarks/h200/bulk_rows/call1.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
source experiments/h200/lib.sh
ab_pair 2 1
timeout 150 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
timeout 110 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128: exit $?"
grep -vE "^\{" "$OUT/h128_b512.log" | tail -4
gzip "$OUT"/h128/ptx/*.ptx 2>/dev/null
pack_out
