#!/usr/bin/env bash
# The gate kernel over block chunks (gating.moba_gate_topk's `chunk`): gate_tiles.py at five
# points, the first configuration the new default and the others checked equal to it (the
# unchunked one of the parent commit among them: tile * blocks <= 8192 in one chunk); then the
# step's and the gating's GPU time at S=64K, block 256, top-3 (trace_moba.py), and
# bench_kernel.py rows at S=64K, block 256 (the grid's missing k = 8, 16, 32 and k = 3 again).
# Usage on the device: bash benchmarks/h200/ranks/call2.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
source experiments/h200/lib.sh
gate_tiles 120 65536 256 3 128,8 32,4,256 128,8,32 64,4,64 128,4
gate_tiles 120 65536 256 16 128,8 32,4,256
gate_tiles 120 65536 512 3 128,8 64,4,128
gate_tiles 120 32768 256 3 128,8 64,4,128
gate_tiles 120 32768 512 3 128,8 128,8,32 64,4,64
timeout 200 python3 experiments/trace_moba.py --seq 65536 --block 256 --k 3 --heads h128 \
    --backend mosaic --out "$OUT/trace_64k_b256_k3.json" > "$OUT/trace_64k_b256_k3.log" 2>&1
echo "trace_moba: exit $?"; head -12 "$OUT/trace_64k_b256_k3.log"
t0=$(date +%s)
timeout "${LIMIT:-250}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 65536 --blocks 256 --ks 3 8 16 32 --heads h128 --out "$OUT/h128_65536_b256.json" \
    > "$OUT/h128_65536_b256.log" 2>&1
echo "bench_kernel: exit $? after $(( $(date +%s) - t0 )) s"
grep -vE "^\{" "$OUT/h128_65536_b256.log" | tail -12
