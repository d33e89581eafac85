#!/usr/bin/env bash
# Tile / launch variants of the MoBA kernels on one H200: each kernel timed alone per variant
# (16/16 x 128 at S=32K, block 512, k=3; 14/2 x 64, block 256, k=8), then forward+backward of
# the default against the variant with the least kernel time, beside cuDNN. Writes to $OUT.
#   bash experiments/h200/kernel_tiles.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
source "$(dirname "$0")/lib.sh"
V128=${V128:-"64,64,64,8,2,0;64,128,64,8,2,0;64,64,64,4,1,0;64,64,64,8,3,0;64,64,64,4,2,0,4,1;64,64,128,4,2,0,8,1"}
V64=${V64:-"64,64,64,8,2,a;64,64,64,4,1,a;64,64,64,4,2,a,8,2;64,64,64,4,2,a,4,1"}

pick() {  # the variant (bench_kernel syntax) with the least fwd + dq + dk/dv kernel time
  python3 - "$1" "$2" <<'PY'
import json, sys
sys.path.insert(0, ".")
from experiments.bench_kernel import parse_variant, variant_tag
prof = json.load(open(sys.argv[1]))["rows"][0]
d = prof["d"]
best = None
for text in ["64,64,64,4,2,a"] + sys.argv[2].split(";"):
    tag = variant_tag(parse_variant(text).fit(prof["block"], d))
    total = sum(prof.get(f"{s}_kernel_ms_{tag}", float("inf")) for s in ("fwd", "dq", "dkv"))
    print(f"  {tag:40s} fwd {prof.get(f'fwd_kernel_ms_{tag}', float('nan')):.3f} "
          f"dq {prof.get(f'dq_kernel_ms_{tag}', float('nan')):.3f} "
          f"dkv {prof.get(f'dkv_kernel_ms_{tag}', float('nan')):.3f} total {total:.3f}",
          file=sys.stderr)
    if best is None or total < best[0]:
        best = (total, text)
print(best[1])
PY
}

python3 experiments/bench_kernel.py --skip-check --profile --seqs 32768 --blocks 512 --ks 3 \
    --heads h128 --variants "$V128" --out "$OUT/profile_h128.json" > "$OUT/profile.log" 2>&1
echo "profile h128: exit $?"
B128=$(pick "$OUT/profile_h128.json" "$V128")
python3 experiments/bench_kernel.py --skip-check --profile --seqs 32768 --blocks 256 --ks 8 \
    --heads h64 --variants "$V64" --out "$OUT/profile_h64.json" >> "$OUT/profile.log" 2>&1
echo "profile h64: exit $?"
B64=$(pick "$OUT/profile_h64.json" "$V64")
echo "least kernel time: h128 $B128, h64 $B64"

time_headline "$B128" "$B64"
grep -A20 "^kind " "$OUT/h128.log"
grep -A20 "^kind " "$OUT/h64.log"
