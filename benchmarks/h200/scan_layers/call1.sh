#!/usr/bin/env bash
# The GPU preset's train step with its layers scanned (model.scan_layers True, the preset) and
# unrolled over the same stacked parameters (False): median step, peak memory, compile time and
# the first step's loss (ablate_meshes.py), then the unrolled step traced (trace_train.py: GPU
# time by kernel kind, device memory copies included). Needs .whl/ carried. Results in $OUT.
# Ran on commit 663f4e1 (the preset then scanned). Results in call1/.
# Usage on the device: bash benchmarks/h200/scan_layers/call1.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
for scan in True False; do
  timeout 240 python3 -m experiments.ablate_meshes --config=configs/longbench.py \
      --meshes=1x1x1 --steps=5 --warmup=2 --config.model.scan_layers=$scan \
      --out="$OUT/ablate_scan_$scan" > "$OUT/ablate_scan_$scan.log" 2>&1
  echo "ablate_meshes scan_layers=$scan: exit $?"
  grep "^| 1x1x1" "$OUT/ablate_scan_$scan.log" || tail -5 "$OUT/ablate_scan_$scan.log"
done
timeout 200 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
    --steps=3 --config.model.scan_layers=False --out="$OUT/trace_unrolled.json" \
    > "$OUT/trace_unrolled.log" 2>&1
echo "trace_train (unrolled): exit $?"
grep -A 20 'tokens per step' "$OUT/trace_unrolled.log"
