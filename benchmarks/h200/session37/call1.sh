#!/usr/bin/env bash
# The tree after the thirty-seventh session's CPU-only review fixes, on the GPU: every GPU-marked
# test (the gate's and kernels' compiled paths, the shard timing, whose first run of a compiled
# program is now left untimed whoever compiled it), then the main job at the GPU preset for 8
# steps (the step's program compiled before it is timed: step 1's compile_s; steps 6-8's
# step_time_s against the 0.396-0.406 s of 2026-12-04's steps 6-8). Needs .whl/ carried.
# Usage on the device: bash benchmarks/h200/session37/call1.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
gpu_tests 300 tests -m gpu --ignore=tests/test_notebook.py
timeout 200 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=8 --config.optimizer.warmup_steps=2 \
    --config.train.workdir=/tmp/session37_run > "$OUT/train.log" 2>&1
echo "train: exit $?"
cp /tmp/session37_run/metrics.jsonl "$OUT/" 2>/dev/null
python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"step {r['step']}: loss {r['loss']:.3f}, step {r['step_time_s']:.4f} s, compile "
          f"{r['compile_s']:.1f} s, {r['tokens_per_s']:.0f} doc tok/s, compiles {r['compiles']}")
PY
pack_out
