#!/usr/bin/env bash
# dq accumulated inside the dk/dv kernel with relaxed float32 atomics (MobaBlockSizes.fused_dq)
# against the separate dq kernel, in one device call: GPU tests, forward+backward of both beside
# cuDNN at the 16/16 x 128 headline points (block 512, k = 3, 8), and the GPU-time breakdown
# (trace_moba.py) of the default and of the fused variant FUSED. PART=h64 times the 14/2 x 64
# points (block 256, k = 8, 16) instead.
#   bash experiments/h200/fused_dq_call.sh; PART=h64 bash experiments/h200/fused_dq_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
FUSED=${FUSED:-"64,64,64,4,2,a,8,2,1,1"}
VARIANTS=${VARIANTS:-"64,64,64,4,2,a,4,2,1,1;$FUSED;64,64,64,4,2,a,8,1,1,1;64,64,128,4,2,a,8,2,1,1"}
trace() {  # heads block k [variant]
  python3 experiments/trace_moba.py --heads "$1" --block "$2" --k "$3" ${4:+--variant "$4"} \
      --out "$OUT/trace_$1_b$2_k$3${4:+_v}.json" > "$OUT/trace_$1_b$2_k$3${4:+_v}.log" 2>&1
  echo "trace $*: exit $?"
}
if [ "${PART:-h128}" = h128 ]; then
  python3 -m pytest tests/test_moba_kernel.py tests/test_relaxed_atomics.py \
      tests/test_moba_hopper.py -m gpu -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
  echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
  python3 experiments/bench_kernel.py --variants-everywhere --seqs 32768 --blocks 512 \
      --ks 3 8 --heads h128 --variants "$VARIANTS" --out "$OUT/h128.json" > "$OUT/h128.log" 2>&1
  echo "h128: exit $?"
  trace h128 512 3
  trace h128 512 3 "$FUSED"
  grep -A24 "^kind " "$OUT/h128.log"
else
  python3 experiments/bench_kernel.py --skip-check --variants-everywhere --seqs 32768 \
      --blocks 256 --ks 8 16 --heads h64 --variants "$VARIANTS" --out "$OUT/h64.json" \
      > "$OUT/h64.log" 2>&1
  echo "h64: exit $?"
  trace h64 256 8
  trace h64 256 8 "$FUSED"
  grep -A24 "^kind " "$OUT/h64.log"
fi
for f in "$OUT"/trace_*.log; do echo; head -14 "$f"; done
