#!/usr/bin/env bash
# The GPU preset's train step without remat (model.remat=False) beside call1.sh's two rows: traced
# by kernel kind, then timed with its peak memory, and with remat keeping the attention results
# again. Needs .whl/ carried. Results in $OUT.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 170 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
    --steps=3 --config.model.remat=False --out="$OUT/trace_no_remat.json" \
    > "$OUT/trace_no_remat.log" 2>&1
echo "trace_train remat=False: exit $?"
grep -A 14 'tokens per step' "$OUT/trace_no_remat.log"
for remat in False True; do
  timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py --meshes=1x1x1 \
      --steps=5 --warmup=2 --config.model.remat=$remat "--config.model.remat_keep=('attention',)" \
      --out="$OUT/ablate_remat_$remat" \
      > "$OUT/ablate_remat_$remat.log" 2>&1
  echo "ablate_meshes remat=$remat: exit $?"
  head -1 "$OUT/ablate_remat_$remat.log"
done
