#!/usr/bin/env bash
# The main job on every GPU of the machine (data parallel, the GPU preset of
# configs/longbench.py: SAB batching), for STEPS steps, one run per arm of ARMS (default
# "dst nodst"): dst - DST on, with per-shard timing (each GPU's measured time fed to DST);
# nodst - DST off, per-shard timing on; fused - DST off and per-shard timing off (the
# one-program step, one all-reduce after the micro-batches). Copies each run's metrics.jsonl to
# $OUT and prints a per-run summary.
#   [ARMS="dst nodst fused"] bash experiments/h200/train_dp_call.sh [extra --config.* flags]
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
STEPS=${STEPS:-30}
ARMS=${ARMS:-dst nodst}
for arm in $ARMS; do
  dst=$([ $arm = dst ] && echo True || echo False)
  timed=$([ $arm = fused ] && echo False || echo True)
  timeout "${LIMIT:-200}" python3 -m experiments.train --config=configs/longbench.py \
      --config.train.num_steps=$STEPS --config.train.workdir=/tmp/run_$arm \
      --config.optimizer.warmup_steps=$((STEPS / 5)) --config.balance.shard_timing=$timed \
      --config.balance.dst=$dst "$@" \
      > "$OUT/train_$arm.log" 2>&1
  echo "$arm: exit $?"
  cp /tmp/run_$arm/metrics.jsonl "$OUT/metrics_$arm.jsonl" 2>/dev/null
done
python3 - "$OUT" "$ARMS" <<'PY'
import json, sys
import numpy as np
for arm in sys.argv[2].split():
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics_{arm}.jsonl")]
    except OSError:
        print(arm, "no metrics"); continue
    later = [r for r in rows if r["step"] > 5]
    keys = sorted(k for k in rows[-1] if k.startswith("shard_ms/"))
    timed = (f"imbalance {np.mean([r['imbalance_measured'] for r in later]):.3f}, shards "
             + " / ".join(f"{np.median([r[k] for r in later]):.1f}" for k in keys) + " ms, "
             if keys else "shards not timed, ")
    print(f"{arm}: {len(rows)} steps, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}; "
          f"steps 6+: step {1e3 * np.median([r['step_time_s'] for r in later]):.1f} ms, "
          + timed + f"compiles {rows[-1]['compiles']}, budgets "
          + str(sorted({tuple(r[k] for k in sorted(r) if k.startswith('budget/shard'))
                        for r in rows})))
PY
