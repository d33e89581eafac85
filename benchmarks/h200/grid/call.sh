#!/usr/bin/env bash
# The S=32K grid of issue 3 with the kept kernels (Mosaic GPU set): block 512 and 256, k = 2, 3,
# 4, 8, 16, 32 (k_max = k), one head shape per call (HEADS=h128 or h64), cuDNN timed in the
# same process, then the budget sweep k = 2..16 under k_max 16 at each block (R^2). Usage on
# the device: HEADS=h128 bash benchmarks/h200/grid/call.sh. One tarball comes back.
set -uo pipefail
OUT=${OUT:?}
HEADS=${HEADS:?}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout "${LIMIT:-560}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 256 --ks 2 3 4 8 16 32 --sweep 16 --heads "$HEADS" \
    --out "$OUT/$HEADS.json" > "$OUT/$HEADS.log" 2>&1
echo "bench_kernel $HEADS: exit $? after $(( $(date +%s) - start )) s"
grep -vE "^\{" "$OUT/$HEADS.log" | tail -40
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
