#!/usr/bin/env bash
# The gate over block chunks with its merge in a kernel (the committed default: chunks from
# 256 blocks): the gate's GPU tests; gate_tiles.py at S=64K, block 256 (k = 3, 16) against
# one chunk of 32-token tiles (the parent commit's configuration); the step and the gating
# traced at S=64K, block 256, top-3; bench_kernel.py at S=64K, block 256, k = 3, 16; the
# layout's running count
# over shorter token chunks (layout_probe.py).
# Usage on the device: bash benchmarks/h200/ranks/call3.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
source experiments/h200/lib.sh
gpu_tests 120 tests/test_moba_gate.py -m gpu || exit 1
gate_tiles 60 65536 256 3 128,8 32,4,256 128,4
gate_tiles 60 65536 256 16 128,8 32,4,256
timeout 120 python3 experiments/trace_moba.py --seq 65536 --block 256 --k 3 --heads h128 \
    --backend mosaic --out "$OUT/trace_64k_b256_k3.json" > "$OUT/trace_64k_b256_k3.log" 2>&1
echo "trace_moba: exit $?"; head -14 "$OUT/trace_64k_b256_k3.log"
t0=$(date +%s)
timeout "${LIMIT:-130}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 65536 --blocks 256 --ks 3 16 --heads h128 --out "$OUT/h128_65536_b256.json" \
    > "$OUT/h128_65536_b256.log" 2>&1
echo "bench_kernel: exit $? after $(( $(date +%s) - t0 )) s"
grep -vE "^\{" "$OUT/h128_65536_b256.log" | tail -8
# The layout's count over 128-, 64- and 32-token chunks at 256 blocks, and the ranks from
# per-chunk reads (scatter-add) and compares inside the chunk, whose work follows T, not T * N.
for point in "65536 256 _read_ranks scatter"; do
  set -- $point
  timeout 90 python3 -m experiments.layout_probe --seq "$1" --block "$2" --ks 3 16 \
      --only "${@:3}" --no-pieces --out "$OUT/probe_$1_$2.json" > "$OUT/probe_$1_$2.log" 2>&1
  echo "layout_probe $1 $2: exit $?"; grep -v Warning "$OUT/probe_$1_$2.log" | tail -16
done
# Everything back as one archive (the device returns a limited number of files).
tar czf /tmp/call3.tgz -C "$OUT" . && rm -f "$OUT"/* && mv /tmp/call3.tgz "$OUT"/
