#!/usr/bin/env bash
# The persistent forward (forward_kernel="triton_persistent": four chunks per program, one loop
# over their key tiles) against the one-chunk forward, in one device call: GPU correctness and
# forward+backward beside cuDNN at the headline point, then the GPU time of every kernel
# (trace_moba.py) of both, alternating, at both headline shapes. Writes to $OUT.
#   bash experiments/h200/persistent_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
python3 experiments/bench_kernel.py --forward-kernels triton triton_persistent --seqs 32768 \
    --blocks 512 --ks 3 --heads h128 --out "$OUT/h128.json" > "$OUT/h128.log" 2>&1
echo "h128: exit $?"
for spec in "h128 512 3" "h64 256 8"; do
  set -- $spec
  for fk in triton triton_persistent triton triton_persistent; do
    python3 experiments/trace_moba.py --heads "$1" --block "$2" --k "$3" --forward-kernel "$fk" \
        --out /tmp/t.json > /tmp/t.log 2>&1 || tail -5 /tmp/t.log
    python3 - "$fk" "$spec" /tmp/t.json >> "$OUT/persistent.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
ms = {row["kernel"]: row["ms_per_step"] for row in r["rows"]}
fwd = ms.get("moba_fwd", ms.get("moba_fwd_persistent"))
print(f"{sys.argv[2]} {sys.argv[1]}: total {r['kernel_ms_per_step']:.3f} fwd {fwd:.3f} "
      f"dq {ms['moba_dq']:.3f} dkv {ms['moba_dkv']:.3f}")
PY
  done
done
grep -E "^check|^gate" "$OUT/h128.log"
grep -A6 "^kind " "$OUT/h128.log"
cat "$OUT/persistent.txt"
