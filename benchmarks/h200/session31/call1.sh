#!/usr/bin/env bash
# The GPU-marked tests and the config tests on the H200, then the main job for eight steps on
# real data (its metrics now log tokens_per_s over document tokens and row_tokens_per_s over
# the padded rows). Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session31/call1.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
gpu_tests 300 tests/test_moba_kernel.py tests/test_moba_hopper.py tests/test_moba_gate.py \
    tests/test_shard_timing.py -m gpu || exit 1
mv "$OUT/gpu_tests.log" "$OUT/gpu_tests_marked.log"
timeout 200 python3 -m pytest tests/test_config.py -p no:cacheprovider -q > "$OUT/config_tests.log" 2>&1
echo "pytest tests/test_config.py: exit $?"; tail -1 "$OUT/config_tests.log"
timeout 240 python3 -m experiments.train --config=configs/longbench.py \
    --config.train.num_steps=8 --config.optimizer.warmup_steps=2 \
    --config.train.workdir=/tmp/main_run > "$OUT/train_8_steps.log" 2>&1
echo "train (8 steps): exit $?"
cp /tmp/main_run/metrics.jsonl "$OUT/" && python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(f"step {m['step']}: loss {m['loss']:.3f} step {m['step_time_s']:.4f} s, "
          f"tokens/s {m['tokens_per_s']:,.0f} (rows {m['row_tokens_per_s']:,.0f}), "
          f"lr {m['learning_rate']:.2e}, compiles {m['compiles']}")
PY
pack_out
