#!/usr/bin/env bash
# Two chunks per forward / dq program (MobaBlockSizes.chunks_per_program) against one, in one
# device call: the GPU tests, then the GPU time of every kernel (trace_moba.py) of both at the
# headline points, each measured twice in alternating order. Writes to $OUT; tables printed last.
#   bash experiments/h200/chunks_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
python3 -m pytest tests/test_moba_kernel.py -m gpu -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
for spec in "h128 512 3" "h64 256 8"; do
  set -- $spec
  for v in 1 2 1 2; do
    python3 experiments/trace_moba.py --heads "$1" --block "$2" --k "$3" \
        --variant "64,64,64,4,2,a,4,2,1,$v" --out /tmp/t.json > /tmp/t.log 2>&1 || cat /tmp/t.log
    python3 - "$v" "$spec" /tmp/t.json >> "$OUT/chunks.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
ms = {row["kernel"]: row["ms_per_step"] for row in r["rows"]}
print(f"{sys.argv[2]} chunks {sys.argv[1]}: total {r['kernel_ms_per_step']:.3f} fwd "
      f"{ms['moba_fwd']:.3f} dq {ms['moba_dq']:.3f} dkv {ms['moba_dkv']:.3f}")
PY
  done
done
cat "$OUT/chunks.txt"
