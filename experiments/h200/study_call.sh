#!/usr/bin/env bash
# The accuracy study's two seeds at once on a four-GPU machine (one seed per GPU pair: each
# study has two data shards), then one table of both. Writes to $OUT (6 files): the combined
# study.{json,md}, each seed's study.json and its SparseBalance arm's per-step metrics.
#   bash experiments/h200/study_call.sh [extra experiments.accuracy_study flags]
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
LIMIT=${LIMIT:-540}  # seconds for training + evaluation of each seed
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
WORK=${WORK:-/tmp/study}
mkdir -p "$WORK"
for s in 0 1; do
  CUDA_VISIBLE_DEVICES=$((2 * s)),$((2 * s + 1)) timeout "$LIMIT" python3 -m experiments.accuracy_study \
      --seeds=$s --parallel=3 --out_dir="$WORK/s$s" --suite_per_cell=32 --text_per_cell=8 "$@" \
      > "$WORK.s$s.log" 2>&1 &
done
wait
for s in 0 1; do
  echo "== seed $s: $(grep -c finished "$WORK.s$s.log") arms finished"
  tail -3 "$WORK.s$s.log"
  [ -f "$WORK/s$s/study.json" ] || for a in "$WORK"/s$s/*/; do echo "-- $a"; tail -n 4 "$a"/*.log; done
  cp "$WORK/s$s/study.json" "$OUT/s${s}_study.json" 2>/dev/null
  cp "$WORK/s$s/sparsebalance-seed$s/metrics.jsonl" "$OUT/sparsebalance-seed${s}_metrics.jsonl" 2>/dev/null
done
python3 -m experiments.accuracy_study --combine="$WORK/s0/study.json,$WORK/s1/study.json" \
    --out_dir="$OUT/both" | tail -20
