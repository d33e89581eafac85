#!/usr/bin/env bash
# Device call 2, where dk/dv's dS^T store costs its time: the Hopper GPU tests on the working
# tree (both backward paths; its store now goes through shared memory, which dK's product reads
# as its A operand), then the traced A/B (two rounds, 16/16 x 128, S=32K, block 512, top-3) of
#   work      - the working tree's default (dq recomputing S and dP, no store);
#   ab_ds     - the stored-dS path as committed in fc3ceb6 (dS^T from registers into dK's
#               product, a copy of it written to shared memory for the store): smem_a.patch
#               reversed;
#   ab_smem   - the working tree's stored-dS path (dS^T through shared memory for both);
#   ab_nocopy - ab_smem without the store's TMA copy to global memory (timing only: dq then
#               reads unwritten dS).
# Ran on commit c1be859 (the path is not kept: stored_ds.patch, applied to f4b69ec, is that
# commit's kernels and tests). Results in call2/.
# Usage on the device: bash benchmarks/h200/stored_ds/call2.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 200 tests/test_moba_hopper.py -m gpu
for tree in ab_ds ab_smem ab_nocopy; do
  rm -rf "/tmp/$tree" && mkdir -p "/tmp/$tree"
  cp -r pallas_kernels experiments sparsebalance_jax "/tmp/$tree/"
  sed -i 's/^  dq_from_stored_ds: bool = False$/  dq_from_stored_ds: bool = True/' \
      "/tmp/$tree/pallas_kernels/moba/kernels.py"
done
(cd /tmp/ab_ds && patch -s -R -p1 < "$OLDPWD/benchmarks/h200/stored_ds/smem_a.patch")
sed -i '/^            plgpu.copy_smem_to_gmem($/,+1d' /tmp/ab_nocopy/pallas_kernels/moba/hopper/dkv.py
grep -c "dq_from_stored_ds: bool = True" /tmp/ab_*/pallas_kernels/moba/kernels.py
grep -c "ds_a\[...\] = ds16" /tmp/ab_*/pallas_kernels/moba/hopper/dkv.py
grep -c "ds_a, ds_ref.at" /tmp/ab_*/pallas_kernels/moba/hopper/dkv.py
mkdir -p "$OUT/h128"
TREES=". /tmp/ab_ds /tmp/ab_smem /tmp/ab_nocopy" ROUNDS=2 OUT="$OUT/h128" \
    bash experiments/h200/ab_call.sh > "$OUT/h128/call.log" 2>&1
echo "ab_call h128: exit $?"
cat "$OUT/h128/ptxas.txt"
sed -n '/per trace/,$p' "$OUT/h128/call.log"
pack_out
