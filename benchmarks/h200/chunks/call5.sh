#!/usr/bin/env bash
# Device call 5 (2026-12-01, seventh session): the main job's GPU preset on the committed
# code (12 steps), then 14/2 x 64 block 256 top-8 beside cuDNN (cut from call 4). The
# training run stopped on the config check (the preset's 100 warm-up steps exceed 12); call 6
# ran it again with --config.optimizer.warmup_steps=2 (BENCHMARKS.md, seventh session).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 200 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=12 --config.train.checkpoint_every=1000 \
    --config.train.workdir=/tmp/gpu_run > $OUT/train.log 2>&1
echo "train: exit $?"; cp /tmp/gpu_run/metrics.jsonl $OUT/train_metrics.jsonl
timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
    --blocks 256 --ks 8 --heads h64 --out $OUT/h64_b256.json > $OUT/h64_b256.log 2>&1
echo "h64 block 256: exit $?"; sed -n '/^kind /,$p' $OUT/h64_b256.log
python3 - $OUT/train_metrics.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
           if k in ("step", "loss", "step_time_s", "tokens_per_s", "budget_mean")})
PY
