#!/usr/bin/env bash
# MoBA kernels on one H200 in one device call: the GPU tests, each kernel timed alone per
# tile variant, forward+backward against cuDNN with and without full-chunk mask skipping,
# and an Nsight Compute profile of the three attention kernels. Everything lands in $OUT
# (at most 8 files); the short tables are printed last.
#   bash experiments/h200/kernel_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export PYTHONUNBUFFERED=1
source "$(dirname "$0")/lib.sh"
if ! command -v ncu > /dev/null; then
  NCU_DIR=$(ls -d /opt/nvidia/nsight-compute/*/ 2> /dev/null | tail -1)
  [ -n "$NCU_DIR" ] && export PATH="$PATH:$NCU_DIR"
fi
SKIP="64,64,64,4,2,1"
VARIANTS=${VARIANTS:-"$SKIP;64,64,64,4,3,1;128,64,64,8,2,1;64,128,64,4,2,1;64,64,128,4,2,1,8,2;64,64,32,4,2,1"}

python3 -m pytest tests/test_moba_kernel.py tests/test_moba_hopper.py -m gpu -q \
    -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest -m gpu: exit $? ($(tail -1 "$OUT/pytest.txt"))"

python3 experiments/bench_kernel.py --skip-check --profile --seqs 32768 --blocks 512 --ks 3 \
    --heads h128 --variants "$VARIANTS" --out "$OUT/profile.json" > /dev/null 2>&1
echo "profile: exit $?"

# Against the default: masks skipped at D=128 (default off there), kept at D=64 (default on).
time_headline "$SKIP" "64,64,64,4,2,0"

ncu --clock-control none -k 'regex:moba_(fwd|dq|dkv)' -c 6 --set full -f -o /tmp/moba \
    python3 experiments/ncu_moba.py --variants "64,64,64,4,2;$SKIP" > /tmp/ncu.log 2>&1
echo "ncu: exit $? ($(tail -1 /tmp/ncu.log))"
ncu --import /tmp/moba.ncu-rep --page details --csv > "$OUT/ncu_details.csv" 2>&1
ncu --import /tmp/moba.ncu-rep --page details --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    > "$OUT/ncu_summary.txt" 2>&1

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
prof = json.load(open(f"{out}/profile.json"))["rows"][0]
print("\nkernels alone (ms), S=32K block 512 k=3 16/16 x 128:")
tags = sorted({k.split("_ms_")[1] for k in prof if "_ms_" in k})
for t in tags:
    cells = [f"{s} {prof.get(f'{s}_kernel_ms_{t}', float('nan')):.3f}" for s in ("fwd", "dq", "dkv")]
    print(f"  {t:36s} " + "  ".join(cells))
PY
grep -A20 "^kind " "$OUT/h128.log"
grep -A20 "^kind " "$OUT/h64.log"
grep -E "^  [a-z_]+ .*moba_|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Thr|Memory Thr|L2 Hit" \
    "$OUT/ncu_summary.txt" | head -60
