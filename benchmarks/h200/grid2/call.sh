#!/usr/bin/env bash
# The rest of issue 3's grid with the kept kernels (Mosaic GPU set): one sequence length and one
# head shape per process (SEQ=8192 or 65536, HEADS=h128 or h64), block 512 and 256, k = 2, 3,
# 4, 8, 16, 32 (k_max = k), cuDNN timed in the same process; GPU_TESTS=1 runs every GPU-marked
# test first (wheels from .whl/ installed as the device README says). The JSON is written after
# each row, so a run cut by LIMIT keeps the rows it made.
# BLOCKS and KS narrow the grid (defaults "512 256" and "2 3 4 8 16 32").
# Usage on the device: GPU_TESTS=1 SEQ=8192 HEADS=h128 bash benchmarks/h200/grid2/call.sh
set -uo pipefail
OUT=${OUT:?}
SEQ=${SEQ:?}
HEADS=${HEADS:?}
export PYTHONUNBUFFERED=1
if [ "${GPU_TESTS:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  t0=$(date +%s)
  PYTHONPATH=/tmp/site timeout 240 python3 -m pytest tests -m gpu --ignore=tests/test_notebook.py \
      -p no:cacheprovider -ra > "$OUT/gpu_tests.log" 2>&1
  echo "pytest -m gpu: exit $? after $(( $(date +%s) - t0 )) s"
  grep -E "passed|failed|SKIPPED|FAILED|Error|assert" "$OUT/gpu_tests.log" | tail -12
fi
name="${HEADS}_${SEQ}${BLOCKS:+_b${BLOCKS// /_}}"
t0=$(date +%s)
timeout "${LIMIT:-400}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs "$SEQ" --blocks ${BLOCKS:-512 256} --ks ${KS:-2 3 4 8 16 32} --heads "$HEADS" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
echo "bench_kernel $name: exit $? after $(( $(date +%s) - t0 )) s"
grep -vE "^\{" "$OUT/$name.log" | tail -16
