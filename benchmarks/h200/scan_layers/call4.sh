#!/usr/bin/env bash
# The preset's step (layers unrolled) compiled with XLA's dump on: its optimized HLO (gzipped)
# and a two-step trace, to name the reduction fusions the unrolled step runs that the scanned
# one does not (input_reduce_fusion_121, _343 in call 1's trace). Needs .whl/ carried.
# Results in call4/ (the HLO gzipped).
# Usage on the device: bash benchmarks/h200/scan_layers/call4.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text" timeout 240 python3 -m \
    experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 --steps=2 --warmup=0 \
    --top=40 --out="$OUT/trace.json" > "$OUT/trace.log" 2>&1
echo "trace_train: exit $?"
big=$(ls -S /tmp/hlo/*after_optimizations.txt | head -1)
echo "largest optimized module: $big ($(wc -c < "$big") bytes)"
gzip -c "$big" > "$OUT/step_after_optimizations.txt.gz"
grep -A 40 'tokens per step' "$OUT/trace.log" | grep -E "reduce|memcpy|tokens per step"
