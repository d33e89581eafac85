#!/usr/bin/env bash
# The stacked weights split into their layers in one op (transformer.py; its gradient one
# concatenation instead of a padded add per layer over the whole stack): the preset's step
# (layers unrolled) traced in alternating processes, the tree before (ab_base, carried) and
# the working tree, then the working tree's median step. Needs .whl/ and ab_base/ carried.
# Usage on the device: bash benchmarks/h200/scan_layers/call10.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
for tree in ab_base . ; do
  tag=$([ "$tree" = . ] && echo work || echo base)
  (cd "$tree" && PYTHONPATH="/tmp/site:." timeout 120 python3 -m experiments.trace_train \
      --config=configs/longbench.py --meshes=1x1x1 --steps=3 --top=40 \
      --config.model.scan_layers=False --out="$OUT/train_$tag.json" > "$OUT/train_$tag.log" 2>&1)
  echo "trace_train $tag: exit $?"
  grep -A 40 'tokens per step' "$OUT/train_$tag.log" | grep -E "tokens per step|xla_other|loop_add_fusion" | head -5
done
timeout 150 python3 -m experiments.ablate_meshes --config=configs/longbench.py --meshes=1x1x1 \
    --steps=5 --warmup=2 --config.model.scan_layers=False --out="$OUT/ablate" > "$OUT/ablate.log" 2>&1
echo "ablate_meshes: exit $?"
grep "^| 1x1x1" "$OUT/ablate.log"
pack_out
