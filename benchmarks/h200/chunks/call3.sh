#!/usr/bin/env bash
# Device call 3 (2026-12-01, seventh session; call 2 ran it without the mkdir and lost its
# traces): dk/dv on 128-row chunk steps at head_dim 64 (ab_c128: chunk_rows 128 below head_dim 128; ab_c128s3: and 3 chunk stages) against the
# working tree (64-row steps, the gate's passes bounded by the budget) and ab_base (HEAD
# before both); the gate's change at k=3 under k_max 16; then the GPU test of ab_c128.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p $OUT/h64 $OUT/h128 $OUT/k16 $OUT/h64k8
TREES=". ab_c128 ab_c128s3" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
TREES="ab_base ." ROUNDS=1 OUT=$OUT/h128 bash experiments/h200/ab_call.sh > $OUT/h128_call.log 2>&1
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h128 --block 512 --k 3 --k-max 16" \
    OUT=$OUT/k16 bash experiments/h200/ab_call.sh > $OUT/k16_call.log 2>&1
TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3 --k-max 8" \
    OUT=$OUT/h64k8 bash experiments/h200/ab_call.sh > $OUT/h64k8_call.log 2>&1
[ "${PYTEST:-1}" = 1 ] && (cd ab_c128 && timeout 200 python3 -m pytest tests/test_moba_hopper.py \
    -m gpu -q -p no:cacheprovider > $OUT/c128_pytest.txt 2>&1; echo "exit $?" >> $OUT/c128_pytest.txt)
python3 experiments/h200/trace_table.py $OUT/*/trace_*.json
grep -h "registers" $OUT/*/ptxas.txt | grep dkv
[ -e $OUT/c128_pytest.txt ] && tail -3 $OUT/c128_pytest.txt
