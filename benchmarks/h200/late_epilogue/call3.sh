#!/usr/bin/env bash
# Device call 3 (2026-12-01, tenth session): the forward's and dq's work items built once, in
# the forward (hopper.row_items, kept for dq; each kernel derives its own key steps in its item
# reader), against ab_base (bb698c7's kernels: each kernel built its own list): the traced step
# at 16/16 x 128 top-3 (two rounds, the working tree's step HLO kept) and 14/2 x 64 (one);
# then every GPU test and the working tree beside cuDNN at 16/16 x 128 and 14/2 x 64, top-3.
# Before the call, on this machine:
#   rm -rf ab_base && mkdir ab_base && git archive bb698c7 pallas_kernels experiments | tar -x -C ab_base
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
[ -d ab_base ] || { echo "make ab_base first (see the header)"; exit 1; }
mkdir -p $OUT/k3 $OUT/h64
TREES=". ab_base" ROUNDS=2 HLO=1 OUT=$OUT/k3 bash experiments/h200/ab_call.sh > $OUT/k3_call.log 2>&1
TREES=". ab_base" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
timeout 200 python3 -m pytest tests -m gpu --ignore=tests/test_notebook.py -q \
    -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed' $OUT/pytest_gpu.txt | tail -1))"
timeout 120 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --out $OUT/h128.json > $OUT/h128.log 2>&1
echo "h128: exit $?"
timeout 100 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 512 --ks 3 --heads h64 --out $OUT/h64.json > $OUT/h64.log 2>&1
echo "h64: exit $?"
for f in h128 h64; do sed -n '/^kind /,$p' $OUT/$f.log; done
