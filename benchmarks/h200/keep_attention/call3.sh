#!/usr/bin/env bash
# model.remat_keep: the GPU preset's train step (one H200, mesh 1x1x1) keeping nothing, the
# attention results, and the attention results and the SwiGLU's gate and up projections - each
# timed with its peak memory (ablate_meshes.py); the last also traced (trace_train.py); then the
# main job itself for eight steps with the preset as it is. Needs .whl/ carried. Results in $OUT.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
run=0
for keep in "()" "('attention',)" "('attention','mlp')"; do
  run=$((run + 1))
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py --meshes=1x1x1 \
      --steps=5 --warmup=2 "--config.model.remat_keep=$keep" --out="$OUT/ablate_$run" \
      > "$OUT/ablate_$run.log" 2>&1
  echo "ablate_meshes remat_keep=$keep: exit $?"
  head -1 "$OUT/ablate_$run.log"
done
timeout 170 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
    --steps=3 "--config.model.remat_keep=('attention','mlp')" --out="$OUT/trace_mlp.json" \
    > "$OUT/trace_mlp.log" 2>&1
echo "trace_train remat_keep=('attention','mlp'): exit $?"
grep -A 14 'tokens per step' "$OUT/trace_mlp.log"
timeout 200 python3 -m experiments.train --config=configs/longbench.py --config.train.num_steps=8 \
    --config.optimizer.warmup_steps=2 --config.train.workdir=/tmp/keep_run \
    > "$OUT/train_8_steps.log" 2>&1
echo "train (8 steps): exit $?"
tail -3 /tmp/keep_run/metrics.jsonl
