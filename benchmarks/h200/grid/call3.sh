#!/usr/bin/env bash
# The rest of the 14/2 x 64 grid that call 2 (call.sh, HEADS=h64) ran out of time for: block
# 256 at k = 32 and the budget sweep k = 2..16 under k_max 16 at block 256, cuDNN timed in the
# same process. Usage on the device: bash benchmarks/h200/grid/call3.sh. One tarball comes back.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout "${LIMIT:-300}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 256 --ks 32 --sweep 16 --heads h64 --out "$OUT/h64_b256.json" \
    > "$OUT/h64_b256.log" 2>&1
echo "bench_kernel h64 block 256: exit $? after $(( $(date +%s) - start )) s"
grep -vE "^\{" "$OUT/h64_b256.log" | tail -24
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
