#!/usr/bin/env bash
# Device call 7 (2026-12-01, seventh session): dk/dv without ping-pong at 14/2 x 64 now that
# its chunk steps are 128 rows (ab_nopp) against the committed code; then the committed code's
# step at 16/16 x 128, top-3 under k_max 3 and 4 (the gate unrolled, looped).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
mkdir -p $OUT/h64 $OUT/k3 $OUT/k4
TREES=". ab_nopp" ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" \
    OUT=$OUT/h64 bash experiments/h200/ab_call.sh > $OUT/h64_call.log 2>&1
TREES="." ROUNDS=1 OUT=$OUT/k3 bash experiments/h200/ab_call.sh > $OUT/k3_call.log 2>&1
TREES="." ROUNDS=1 TRACE_ARGS="--heads h128 --block 512 --k 3 --k-max 4" \
    OUT=$OUT/k4 bash experiments/h200/ab_call.sh > $OUT/k4_call.log 2>&1
python3 - $OUT/*/trace_*.json <<'PY'
import json, os, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    t = lambda m: sum(r["ms_per_step"] for r in d["rows"] if m in r["kernel"])
    print(f"{path.split('/')[-2]:4s} {os.path.basename(path):20s} kernels {d['kernel_ms_per_step']:.3f}"
          f" fwd {t('moba_fwd'):.3f} dq {t('moba_dq_'):.3f} dkv {t('moba_dkv'):.3f}"
          f" gate {t('moba_gate_topk'):.4f} gating {d['gating_kernel_ms']:.3f}")
PY
grep -h "registers" $OUT/*/ptxas.txt | grep dkv
