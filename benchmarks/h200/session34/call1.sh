#!/usr/bin/env bash
# The GPU preset's train step on the mesh ablation's synthetic batch as it is now built (packed
# as training packs: documents at block starts, targets within each document), where the README's
# 424-428 ms was read on the earlier batch (documents anywhere): the step traced once
# (trace_train: GPU time by kernel group), then its median step in two processes
# (ablate_meshes --meshes=1x1x1, 5 steps after 2 warm-up). Needs .whl/ carried.
# Usage on the device: bash benchmarks/h200/session34/call1.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 150 python3 -m experiments.trace_train \
    --config=configs/longbench.py --meshes=1x1x1 --steps=3 --top=40 \
    --out="$OUT/train.json" > "$OUT/train.log" 2>&1
echo "trace_train: exit $?"
grep -A 40 'tokens per step' "$OUT/train.log" | head -12
for round in 1 2; do
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py \
      --meshes=1x1x1 --steps=5 --warmup=2 --out="$OUT/ablate_$round" > "$OUT/ablate_$round.log" 2>&1
  echo "ablate_meshes round $round: exit $?"
  grep "^| 1x1x1" "$OUT/ablate_$round.log"
done
pack_out
