#!/usr/bin/env bash
# The layout's ranks by a sort of the (token, slot) entries against the committed running
# count, alone (layout_probe.py), at S=32K block 512 and S=64K block 256; the gating's GPU time
# per kernel at S=64K, block 256, top-3 (trace_moba.py); every GPU-marked test first (wheels
# from .whl/ installed as the device README says).
# Usage on the device: bash benchmarks/h200/ranks/call1.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
source experiments/h200/lib.sh
gpu_tests 240 tests -m gpu --ignore=tests/test_notebook.py || exit 1
for point in "32768 512" "65536 256"; do
  set -- $point
  timeout 150 python3 -m experiments.layout_probe --seq "$1" --block "$2" --ks 3 16 \
      --only sorted _read_ranks --no-pieces --out "$OUT/probe_$1_$2.json" \
      > "$OUT/probe_$1_$2.log" 2>&1
  echo "layout_probe $1 $2: exit $?"; cat "$OUT/probe_$1_$2.log" | grep -v Warning | tail -12
done
timeout 200 python3 experiments/trace_moba.py --seq 65536 --block 256 --k 3 --heads h128 \
    --backend mosaic --out "$OUT/trace_64k_b256_k3.json" > "$OUT/trace_64k_b256_k3.log" 2>&1
echo "trace_moba: exit $?"; tail -40 "$OUT/trace_64k_b256_k3.log"
