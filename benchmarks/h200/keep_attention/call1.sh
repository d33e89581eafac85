#!/usr/bin/env bash
# model.remat_keep_attention off and on in the GPU preset's train step (one H200, mesh 1x1x1):
# each traced by kernel kind (trace_train.py), then timed with its peak memory
# (ablate_meshes.py). Needs .whl/ carried (grain, ml-collections, ...). Results in $OUT.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:.
for keep in False True; do
  timeout 170 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
      --steps=3 --config.model.remat_keep_attention=$keep --out="$OUT/trace_keep_$keep.json" \
      > "$OUT/trace_keep_$keep.log" 2>&1
  echo "trace_train keep=$keep: exit $?"
  grep -A 14 'tokens per step' "$OUT/trace_keep_$keep.log"
done
for keep in False True; do
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py --meshes=1x1x1 \
      --steps=5 --warmup=2 --config.model.remat_keep_attention=$keep \
      --out="$OUT/ablate_keep_$keep" > "$OUT/ablate_keep_$keep.log" 2>&1
  echo "ablate_meshes keep=$keep: exit $?"
  cat "$OUT/ablate_keep_$keep"/*.md 2>/dev/null | tail -3
done
