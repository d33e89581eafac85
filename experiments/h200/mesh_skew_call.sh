#!/usr/bin/env bash
# On a two-GPU machine: does the shard on GPU 0 run slower because of the device or of its place
# in the mesh? The mesh benchmark (one workload, a few steps) with the shards in device order,
# in reverse order, and with XLA's command buffers off; then the mesh ablation of the GPU
# preset (data / fsdp / tensor over the two GPUs). Writes $OUT/{order01,order10,nocb}/ and
# $OUT/meshes/ with their logs, and nvidia-smi's clocks, power and throttle reasons (smi.csv).
# ALONE=1: instead, each GPU alone on a one-shard run, then both at once (order01).
#   bash experiments/h200/mesh_skew_call.sh
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
COMMON=(--latency_table=latency_tables --seq_len=32768 --block_size=512 --budget=16
        --buckets=16,24 --repeats=2 --steps=${STEPS:-3} --min_doc_len=256 --shards=2
        --data_parallel=mesh --workloads=chatqa2)
run() {  # name, extra flags...
  local name=$1; shift
  timeout "${LIMIT:-100}" python3 -m experiments.bench_balance "${COMMON[@]}" "$@" \
      --out="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"
}
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
if [ "${ALONE:-0}" = 1 ]; then  # each GPU alone on one shard's documents, then both at once
  run alone0 --shards=1 --devices=0
  run alone1 --shards=1 --devices=1
  run order01 --devices=0,1
  kill $SMI
  python3 - "$OUT" <<'PY'
import csv, json, sys
import numpy as np
for name in ("alone0", "alone1"):
    r = json.load(open(f"{sys.argv[1]}/{name}/bench_balance.json"))
    m = 1e3 * np.array([s["measured_S"][0] for w in r["workloads"].values()
                        for row in w["rows"].values() for s in row["steps"]])
    print(f"{name}: {r['settings']['devices']}: shard median {np.median(m):.1f} ms over "
          f"{len(m)} steps ({np.round(m, 1).tolist()})")
rows = list(csv.reader(open(f"{sys.argv[1]}/smi.csv")))[1:]
for gpu in ("0", "1"):
    mine = [r for r in rows if len(r) > 7 and r[1].strip() == gpu]
    busy = [r for r in mine if float(r[4].split()[0]) > 200]
    sm = [float(r[2].split()[0]) for r in busy]
    print(f"GPU {gpu}: {len(busy)} samples above 200 W: SM clock median "
          f"{np.median(sm) if sm else float('nan'):.0f} MHz, power median "
          f"{np.median([float(r[4].split()[0]) for r in busy]) if busy else float('nan'):.0f} W, "
          f"throttle reasons {sorted(set(r[7].strip() for r in busy))}")
PY
  exit 0
fi
run order01 --devices=0,1
run order10 --devices=1,0
XLA_FLAGS=--xla_gpu_enable_command_buffer= run nocb --devices=0,1
kill $SMI
timeout "${MESH_LIMIT:-240}" python3 -m experiments.ablate_meshes --config=configs/longbench.py:gpu \
    --meshes=2x1x1,1x2x1,1x1x2 --steps=5 --warmup=2 --out="$OUT/meshes" > "$OUT/meshes.log" 2>&1
echo "meshes: exit $?"
python3 - "$OUT" <<'PY'
import json, sys
import numpy as np
for name in ("order01", "order10", "nocb"):
    try:
        r = json.load(open(f"{sys.argv[1]}/{name}/bench_balance.json"))
    except OSError:
        continue
    runs = [np.array(s["measured_S"]) for w in r["workloads"].values()
            for row in w["rows"].values() for s in row["steps"]]
    m = 1e3 * np.array(runs)
    slow = (m[:, 0] > m[:, 1]).mean()
    print(f"{name}: devices {r['settings']['devices']}: shard 0 / shard 1 median "
          f"{np.median(m[:, 0]):.1f} / {np.median(m[:, 1]):.1f} ms; shard 0 slower in "
          f"{100 * slow:.0f}% of {len(m)} steps")
PY
tail -8 "$OUT/meshes.log"
