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
source experiments/h200/lib.sh
if [ "${GPU_TESTS:-0}" = 1 ]; then
  gpu_tests 240 tests -m gpu --ignore=tests/test_notebook.py || exit 1
fi
name="${HEADS}_${SEQ}${BLOCKS:+_b${BLOCKS// /_}}"
t0=$(date +%s)
timeout "${LIMIT:-400}" python3 experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs "$SEQ" --blocks ${BLOCKS:-512 256} --ks ${KS:-2 3 4 8 16 32} --heads "$HEADS" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
echo "bench_kernel $name: exit $? after $(( $(date +%s) - t0 )) s"
grep -vE "^\{" "$OUT/$name.log" | tail -16
