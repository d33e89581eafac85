#!/usr/bin/env bash
# The dq merge's slot sum as adds instead of a reduce (pallas_kernels/moba/attention.py,
# xla_merge): the preset's step (layers unrolled) traced, where call 4's HLO ran the reduce as
# a row reduction over the slots (input_reduce_fusion_121, 26 ms a step); then the kernels' own
# step traced (16/16 x 128, S=32K, block 512, top-3), whose dq merge had no transposing consumer
# (loop_convert_fusion, 0.134 ms in stored_ds/call2's work traces). Needs .whl/ carried.
# Ran on commit 31f4af7 (the change is not kept: slot_adds.patch). Results in call5/.
# Usage on the device: bash benchmarks/h200/scan_layers/call5.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
timeout 150 python3 -m experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 \
    --steps=3 --top=40 --out="$OUT/trace_unrolled.json" > "$OUT/trace_unrolled.log" 2>&1
echo "trace_train (unrolled, adds): exit $?"
grep -A 40 'tokens per step' "$OUT/trace_unrolled.log" \
    | grep -E "tokens per step|xla_other|transpose|reduce_fusion_|memcpy" | head -14
timeout 100 python3 experiments/trace_moba.py --heads h128 --block 512 --k 3 --backend mosaic \
    --reps 10 --out "$OUT/trace_moba.json" > "$OUT/trace_moba.log" 2>&1
echo "trace_moba: exit $?"
python3 experiments/h200/trace_table.py "$OUT/trace_moba.json" 2>&1 | tail -2
python3 - "$OUT/trace_moba.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print([(r["kernel"], round(r["ms_per_step"], 4)) for r in rows[:8]])
PY
