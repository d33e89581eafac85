#!/usr/bin/env bash
# Run 2026-12-04 on 3a7c9c2 (results in call6/; the patch is now in the tree): dq's merge output pinned row-major (dq_layout.patch:
# jax.experimental.layout.with_layout_constraint in attention.py's _moba_bwd), so that XLA
# keeps the merge as it runs scanned (a reduce over the slots, then a tiled transpose for the
# qkv projection's backward) instead of the unrolled step's row reduction (26 ms a step, call 4).
# A/B in alternating processes: the working tree and /tmp/ab_layout (the same tree with the
# patch applied): the preset's step traced (layers unrolled, then scanned), and the kernels' own
# step traced (16/16 x 128, S=32K, block 512, top-3), where the merge has no transposing
# consumer. Needs .whl/ carried. Results in $OUT.
# Usage on the device: bash benchmarks/h200/scan_layers/call6.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
rm -rf /tmp/ab_layout && mkdir -p /tmp/ab_layout
cp -r configs experiments pallas_kernels sparsebalance_jax latency_tables /tmp/ab_layout/
(cd /tmp/ab_layout && patch -s -p1 < "$OLDPWD/benchmarks/h200/scan_layers/dq_layout.patch") \
    || exit 1
for scan in False True; do
  for tree in . /tmp/ab_layout; do
    tag=$([ "$tree" = . ] && echo work || echo layout)
    (cd "$tree" && PYTHONPATH="/tmp/site:." timeout 150 python3 -m experiments.trace_train \
        --config=configs/longbench.py --meshes=1x1x1 --steps=3 --top=40 \
        --config.model.scan_layers=$scan --out="$OUT/train_${tag}_scan_$scan.json" \
        > "$OUT/train_${tag}_scan_$scan.log" 2>&1)
    echo "trace_train $tag scan_layers=$scan: exit $?"
    grep -A 40 'tokens per step' "$OUT/train_${tag}_scan_$scan.log" \
        | grep -E "tokens per step|xla_other|input_reduce_fusion_121|transpose" | head -6
  done
done
for tree in . /tmp/ab_layout; do
  tag=$([ "$tree" = . ] && echo work || echo layout)
  timeout 100 python3 "$tree/experiments/trace_moba.py" --heads h128 --block 512 --k 3 \
      --backend mosaic --reps 10 --out "$OUT/moba_$tag.json" > "$OUT/moba_$tag.log" 2>&1
  echo "trace_moba $tag: exit $?"
done
python3 experiments/h200/trace_table.py "$OUT"/moba_*.json 2>&1 | tail -3
