#!/usr/bin/env bash
# On a two-GPU machine: does the shard on GPU 0 run slower because of the device or of its place
# in the mesh? The mesh benchmark (one workload, a few steps) with the shards in device order,
# in reverse order, and with XLA's command buffers off; then the mesh ablation of the GPU
# preset (data / fsdp / tensor over the two GPUs). Writes $OUT/{order01,order10,nocb}/ and
# $OUT/meshes/ with their logs.
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
run order01 --devices=0,1
run order10 --devices=1,0
XLA_FLAGS=--xla_gpu_enable_command_buffer= run nocb --devices=0,1
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
