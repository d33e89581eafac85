#!/usr/bin/env bash
# One device call for a change to the Hopper kernels: their GPU tests, the GPU-time breakdown
# of a forward+backward step (trace_moba.py), where each kernel's warpgroups spend their
# cycles (profile_hopper.py), and forward+backward beside cuDNN at the 16/16 x 128 headline
# points (block 512; KS, default k = 3 8 16). BACKENDS="triton mosaic" times both kernel sets;
# PROFILE_ARGS go to profile_hopper.py, PROFILE=0 leaves it out; ALONE_ARGS (e.g. "--configs
# 128,2,1 128,2,0") first times kernel configurations alone (persistent_forward.py), with
# ptxas' register and spill report of every kernel compiled there; TESTS=0 leaves out the GPU
# tests.
#   bash experiments/h200/step_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
KS=${KS:-"3 8 16"}
BACKENDS=${BACKENDS:-"mosaic"}
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
      > "$OUT/pytest.txt" 2>&1
  echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
fi
if [ -n "${ALONE_ARGS:-}" ]; then
  # The dump variables also print every kernel's IR: the log stays here, its table goes out.
  mkdir -p /tmp/mgpu_dump  # Mosaic GPU writes no dump into a folder that does not exist
  # shellcheck disable=SC2086
  MOSAIC_GPU_DUMP_TO=/tmp/mgpu_dump MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 timeout 300 \
      python3 experiments/persistent_forward.py $ALONE_ARGS --out "$OUT/alone.json" \
      > /tmp/alone.log 2>&1
  echo "alone: exit $?"; grep -A30 "^kernel " /tmp/alone.log | tee "$OUT/alone.log"
  grep -H -E "Used [0-9]+ registers|spill" /tmp/mgpu_dump/*.ptxas 2> /dev/null \
      | sed 's|.*/||' | sort -u > "$OUT/ptxas.txt"
  head -40 "$OUT/ptxas.txt"
fi
timeout 90 python3 experiments/trace_moba.py --heads h128 --block 512 --k 3 \
    --backend mosaic --out "$OUT/trace.json" > "$OUT/trace.log" 2>&1
echo "trace: exit $?"
if [ "${PROFILE:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout 120 python3 experiments/profile_hopper.py ${PROFILE_ARGS:-} --out "$OUT/prof.json" \
      > "$OUT/prof.log" 2>&1
  echo "profile: exit $?"; tail -40 "$OUT/prof.log"
fi
# shellcheck disable=SC2086
timeout 240 python3 experiments/bench_kernel.py --backends $BACKENDS --seqs 32768 --blocks 512 \
    --ks $KS --heads h128 --out "$OUT/h128.json" > "$OUT/h128.log" 2>&1
echo "h128: exit $?"; grep -A8 "^kind " "$OUT/h128.log"
head -14 "$OUT/trace.log"
