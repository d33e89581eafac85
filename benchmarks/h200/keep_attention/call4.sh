#!/usr/bin/env bash
# The GPU preset's train step (remat_keep as the preset) compiled with XLA's dump on: its
# optimized HLO (the largest module after optimizations, gzipped) and a one-step trace, to find
# what the step's device memory copies copy. Needs .whl/ carried. Results in $OUT.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text" timeout 200 python3 -m \
    experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 --steps=2 --warmup=0 \
    --top=40 --out="$OUT/trace.json" > "$OUT/trace.log" 2>&1
echo "trace_train: exit $?"
big=$(ls -S /tmp/hlo/*after_optimizations.txt | head -1)
echo "largest optimized module: $big ($(wc -c < "$big") bytes)"
gzip -c "$big" > "$OUT/step_after_optimizations.txt.gz"
ls -S /tmp/hlo/*after_optimizations*buffer-assignment* 2>/dev/null | head -1 | xargs -r gzip -c \
    > "$OUT/step_buffer_assignment.txt.gz"
grep -c ' copy(' "$big"
