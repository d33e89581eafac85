#!/usr/bin/env bash
# Device call 2 (2026-12-02, sixteenth session): the fused gate kernel also counts the layout's
# read ranks per tile of its tokens (kernels.moba_gate_topk(read_counts=True): a
# lower-triangular 0/1 product of the tile's reads, read back at each slot's block), in place
# of XLA's [T, N] one-hot, its product and gathers (the working tree), against bdc0334
# (ab_base: `git archive bdc0334 pallas_kernels experiments | tar -x -C ab_base`). The traced
# step at 16/16 x 128, block 512, top-3; the GPU tests of the gate and of the Hopper kernels;
# the working tree beside cuDNN at top-3; then the traced step at top-16 (k_max 16: the
# counts' read-back loops over 15 picks) and at 14/2 x 64, block 256, top-8. One tarball.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
trace() {  # name trace-args
  mkdir -p "$OUT/$1"
  TREES="ab_base ." ROUNDS=1 TRACE_ARGS="$2" OUT="$OUT/$1" bash experiments/h200/ab_call.sh \
      > "$OUT/$1/call.log" 2>&1
  echo "ab_call $1: exit $?"
  tail -3 "$OUT/$1/call.log"
}
trace h128_k3 "--heads h128 --block 512 --k 3"
timeout 150 python3 -m pytest tests/test_moba_gate.py tests/test_moba_hopper.py -m gpu \
    -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_b512.json" \
    > "$OUT/h128_b512.log" 2>&1
echo "bench_kernel h128: exit $?"
grep -vE "^\{" "$OUT/h128_b512.log" | tail -4
trace h128_k16 "--heads h128 --block 512 --k 16"
trace h64_k8 "--heads h64 --block 256 --k 8"
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
