set -u
mkdir -p $OUT/h128 $OUT/h64
OUT=$OUT/h128 TREES="ab_base ." ROUNDS=2 bash experiments/h200/ab_call.sh > $OUT/h128/call.log 2>&1
OUT=$OUT/h64 TREES="ab_base ." ROUNDS=1 TRACE_ARGS="--heads h64 --block 512 --k 3" bash experiments/h200/ab_call.sh > $OUT/h64/call.log 2>&1
timeout 200 python3 experiments/profile_hopper.py --kernels forward dq --out $OUT/prof.json > $OUT/prof.log 2>&1; echo prof $?
grep -A10 "^cycles per" $OUT/prof.log
python3 - <<'PY'
import json, glob, os
out = os.environ["OUT"]
for f in sorted(glob.glob(out + "/h*/trace_*.json")):
    d = json.load(open(f)); k = {r["kernel"]: r["ms_per_step"] for r in d["rows"]}
    g = lambda s: sum(v for n, v in k.items() if s in n)
    print(f"{f[len(out)+1:]:28s} kernels {d['kernel_ms_per_step']:.3f} span {d['step_span_ms']:.3f} idle {d['step_idle_ms']:.3f} fwd {g('moba_fwd'):.3f} dq {g('moba_dq'):.3f} dkv {g('moba_dkv'):.3f}")
PY
cd $OUT && tar czf traces.tgz h128 h64 && rm -rf h128/*.json h64/*.json
