#!/usr/bin/env bash
# The GPU preset's train step (one H200, mesh 1x1x1) keeping nothing and keeping the attention
# results (keep=False / True: model.remat_keep () / ('attention',), which the call ran as the
# option's first form, a flag model.remat_keep_attention): each traced by kernel kind
# (trace_train.py), then timed with its peak memory (ablate_meshes.py). Needs .whl/ carried
# (grain, ml-collections, ...). Results in $OUT.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
kept() { if [ "$1" = True ]; then echo "('attention',)"; else echo "()"; fi; }
for keep in False True; do
  timeout 170 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
      --steps=3 "--config.model.remat_keep=$(kept $keep)" --out="$OUT/trace_keep_$keep.json" \
      > "$OUT/trace_keep_$keep.log" 2>&1
  echo "trace_train keep=$keep: exit $?"
  grep -A 14 'tokens per step' "$OUT/trace_keep_$keep.log"
done
for keep in False True; do
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py --meshes=1x1x1 \
      --steps=5 --warmup=2 "--config.model.remat_keep=$(kept $keep)" \
      --out="$OUT/ablate_keep_$keep" > "$OUT/ablate_keep_$keep.log" 2>&1
  echo "ablate_meshes keep=$keep: exit $?"
  cat "$OUT/ablate_keep_$keep"/*.md 2>/dev/null | tail -3
done
