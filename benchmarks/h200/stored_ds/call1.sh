#!/usr/bin/env bash
# Device call 1, dq from the dS that dk/dv stores (MobaBlockSizes.dq_from_stored_ds): the Hopper
# GPU tests on the working tree (both backward paths); the traced A/B of the working tree (its
# default: dq recomputing S and dP) against /tmp/ab_ds (the same tree with the stored-dS path on
# by default), two rounds at 16/16 x 128, block 512, top-3 and one at 14/2 x 64, block 256,
# top-8; then ab_ds beside cuDNN at 16/16 x 128, block 512, k = 3 and 8.
# Ran on commit fc3ceb6 (the path is not kept: stored_ds.patch, applied to f4b69ec, holds it
# with call 2's change; fc3ceb6 is that less smem_a.patch). Results in call1/.
# Usage on the device: bash benchmarks/h200/stored_ds/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 200 tests/test_moba_hopper.py -m gpu
rm -rf /tmp/ab_ds && mkdir -p /tmp/ab_ds
cp -r pallas_kernels experiments sparsebalance_jax /tmp/ab_ds/
sed -i 's/^  dq_from_stored_ds: bool = False$/  dq_from_stored_ds: bool = True/' \
    /tmp/ab_ds/pallas_kernels/moba/kernels.py
grep -c "dq_from_stored_ds: bool = True" /tmp/ab_ds/pallas_kernels/moba/kernels.py
TREES=". /tmp/ab_ds" ab_pair 2
timeout 200 python3 /tmp/ab_ds/experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 8 --heads h128 --out "$OUT/h128_ds_step.json" \
    > "$OUT/h128_ds_step.log" 2>&1
echo "bench ab_ds h128: exit $?"
grep -A4 "^kind " "$OUT/h128_ds_step.log"
pack_out
