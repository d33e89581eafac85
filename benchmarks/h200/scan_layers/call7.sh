#!/usr/bin/env bash
# dq's merge output pinned row-major (call 6's patch, now in the tree): the kernels' GPU tests,
# the preset's step (layers unrolled) in two processes, once scanned, and the main job for eight
# steps on real data. Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/scan_layers/call7.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
gpu_tests 200 tests/test_moba_hopper.py -m gpu || exit 1
for scan in False True False; do
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py \
      --meshes=1x1x1 --steps=5 --warmup=2 --config.model.scan_layers=$scan \
      --out="$OUT/ablate_scan_$scan" >> "$OUT/ablate_scan_$scan.log" 2>&1
  echo "ablate_meshes scan_layers=$scan: exit $?"
  grep "^| 1x1x1" "$OUT/ablate_scan_$scan.log" | tail -1
done
timeout 200 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=8 --config.optimizer.warmup_steps=2 \
    --config.train.workdir=/tmp/unrolled_run > "$OUT/train_8_steps.log" 2>&1
echo "train (8 steps): exit $?"
cp /tmp/unrolled_run/metrics.jsonl "$OUT/" && tail -3 "$OUT/metrics.jsonl"
pack_out
