#!/usr/bin/env bash
# Softmax exponentials as ex2.approx (MobaBlockSizes.fast_exp2, the default) against
# libdevice's exp2f, in one device call: GPU tests, forward+backward of both beside cuDNN at
# the 16/16 x 128 headline points, and the GPU-time breakdown (trace_moba.py) of the default
# and of a three-stage backward. PART=h64 times the 14/2 x 64 points instead, with the launch
# variants V64 beside them.
#   bash experiments/h200/exp2_call.sh; PART=h64 bash experiments/h200/exp2_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
LIBEXP="64,64,64,4,2,a,4,2,0"
V64=${V64:-"$LIBEXP;64,32,64,4,3,a;64,64,64,4,2,a,4,1"}
trace() {  # heads block k [variant]
  python3 experiments/trace_moba.py --heads "$1" --block "$2" --k "$3" ${4:+--variant "$4"} \
      --out "$OUT/trace_$1_b$2_k$3${4:+_v}.json" > "$OUT/trace_$1_b$2_k$3${4:+_v}.log" 2>&1
  echo "trace $*: exit $?"
}
if [ "${PART:-h128}" = h128 ]; then
  python3 -m pytest tests/test_moba_kernel.py tests/test_moba_hopper.py -m gpu \
      -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
  echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
  python3 experiments/bench_kernel.py --variants-everywhere --seqs 32768 --blocks 512 \
      --ks 3 8 16 --heads h128 --variants "$LIBEXP" --out "$OUT/h128.json" > "$OUT/h128.log" 2>&1
  echo "h128: exit $?"
  trace h128 512 3
  trace h128 512 3 "64,64,64,4,2,a,4,3"
  grep -A20 "^kind " "$OUT/h128.log"
else
  python3 experiments/bench_kernel.py --skip-check --variants-everywhere --seqs 32768 \
      --blocks 256 --ks 8 16 --heads h64 --variants "$V64" --out "$OUT/h64.json" \
      > "$OUT/h64.log" 2>&1
  echo "h64: exit $?"
  trace h64 256 8
  grep -A20 "^kind " "$OUT/h64.log"
fi
for f in "$OUT"/trace_*.log; do echo; head -12 "$f"; done
