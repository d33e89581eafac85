#!/usr/bin/env bash
# GPU tests, then where a MoBA forward+backward spends GPU time (experiments/trace_moba.py) at
# the headline points, in one device call. At most 8 files land in $OUT; tables printed last.
#   bash experiments/h200/trace_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
python3 -m pytest tests/test_moba_kernel.py tests/test_moba_hopper.py -m gpu \
    -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
for spec in "h128 512 3" "h128 512 8" "h64 256 8"; do
  set -- $spec
  python3 experiments/trace_moba.py --heads "$1" --block "$2" --k "$3" \
      --out "$OUT/trace_$1_b$2_k$3.json" > "$OUT/trace_$1_b$2_k$3.log" 2>&1
  echo "trace $spec: exit $?"
done
for f in "$OUT"/trace_*.log; do echo; head -25 "$f"; done
