#!/usr/bin/env bash
# Device call 3 (2026-12-02): what a deeper K pipeline would give dq at 16/16 x 128 (S=32K,
# block 512, top-3). With dO gathered by dq itself (the step's way) a fourth K stage is 160
# bytes over the H200's shared memory (lowered on the CPU), so dq is timed alone with q and
# dO both presorted, where (4, 2) fits: K/V stages (3, 2) against (4, 2) and (3, 3), overlapped
# as the default; the step's configuration (dO gathered, (3, 2)) beside them.
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
timeout 400 python3 experiments/persistent_forward.py --heads h128 --block 512 --k 3 \
    --configs 128,2,0 --dq-configs 64,3/2,1,0,1 64,4/2,1,0,1 64,3/3,1,0,1 64,4/2,1,0,1 \
    64,3/2,1,0,1 64,3/2,1,1,1 --dkv-stages 2 --reps 20 --out "$OUT/alone.json" \
    > "$OUT/alone.log" 2>&1
echo "alone: exit $?"
grep -E "^\{" "$OUT/alone.log" | python3 -c "
import ast, sys
for line in sys.stdin:
    r = ast.literal_eval(line)
    print(r.get('kernel'), r.get('block_k'), r.get('stages'), r.get('extra'),
          'ms', r.get('ms'), 'gpu_ms', r.get('gpu_ms'), r.get('max_abs_diff'), r.get('error', ''))
"
