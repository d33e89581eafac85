#!/usr/bin/env bash
# Device call 1 (2026-12-03, nineteenth session): every GPU-marked test with the stricter checks
# (documents starting inside blocks, a per-row error bound beside the tensor's), then the top-3
# point (16/16 x 128, block 512, S=32K, k_max 3) beside cuDNN under XLA's command buffers as
# they default, off, and with graphs of any size, then the default again.
# Usage on the device: bash benchmarks/h200/cmdbuf/call1.sh
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 260 python3 -m pytest tests -m gpu --ignore=tests/test_notebook.py -p no:cacheprovider \
    -ra > "$OUT/gpu_tests.log" 2>&1
echo "pytest -m gpu: exit $? after $(( $(date +%s) - start )) s"
grep -E "passed|failed|SKIPPED|FAILED|Error|assert" "$OUT/gpu_tests.log" | tail -12
run() {  # name, XLA_FLAGS
  local t0=$(date +%s)
  XLA_FLAGS="$2" timeout 75 python3 experiments/bench_kernel.py --skip-check --backends mosaic \
      --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1
  echo "$1 (XLA_FLAGS='$2'): exit $? after $(( $(date +%s) - t0 )) s"
}
run default ""
run cmdbuf_off "--xla_gpu_enable_command_buffer="
run graph_min1 "--xla_gpu_graph_min_graph_size=1"
run default2 ""
for f in default cmdbuf_off graph_min1 default2; do
  echo "== $f"; grep -E "^(moba|cudnn)" "$OUT/$f.log"
done
