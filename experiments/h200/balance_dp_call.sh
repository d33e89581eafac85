#!/usr/bin/env bash
# The straggler benchmark on a two-GPU machine: real data parallelism (one shard per GPU, the
# trainer's step with its real all-reduce), then the one-GPU simulation of the same two shards
# (same documents, batchers, tuner and profiled table), then the per-shard timing GPU tests.
# Writes $OUT/{mesh,simulated}/bench_balance.{json,md,png} and the logs.
#   bash experiments/h200/balance_dp_call.sh [extra experiments.bench_balance flags]
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
COMMON=(--latency_table=latency_tables --seq_len=32768 --block_size=512 --budget=16
        --buckets=16,24 --repeats=2 --steps=${STEPS:-6} --min_doc_len=256 --shards=2 "$@")
timeout "${MESH_LIMIT:-330}" python3 -m experiments.bench_balance "${COMMON[@]}" \
    --data_parallel=mesh --out="$OUT/mesh" > "$OUT/mesh.log" 2>&1
echo "mesh: exit $?"
CUDA_VISIBLE_DEVICES=0 timeout "${SIM_LIMIT:-180}" python3 -m experiments.bench_balance \
    "${COMMON[@]}" --out="$OUT/simulated" > "$OUT/simulated.log" 2>&1
echo "simulated: exit $?"
timeout "${TEST_LIMIT:-90}" python3 -m pytest -q tests/test_shard_timing.py -m gpu \
    > "$OUT/tests.log" 2>&1
echo "tests: exit $?; $(tail -1 "$OUT/tests.log")"
for f in mesh simulated; do echo "== $f"; tail -12 "$OUT/$f.log"; done
