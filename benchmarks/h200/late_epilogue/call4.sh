#!/usr/bin/env bash
# Device call 4 (2026-12-01, tenth session): where the committed kernels' warpgroups spend an
# item's cycles now (the forward without ping-pong at head_dim 128 since the fifth session,
# dk/dv without it at 64 since a18d9ec): experiments/profile_hopper.py at the headline point
# (16/16 x 128, S=32K, block 512, top-3) and at the model's shape (14/2 x 64).
set -uo pipefail
OUT=${OUT:?}
export PYTHONUNBUFFERED=1
for heads in h128 h64; do
  timeout 200 python3 experiments/profile_hopper.py --heads $heads --block 512 --k 3 \
      --out $OUT/prof_$heads.json > $OUT/prof_$heads.log 2>&1
  echo "profile $heads: exit $?"
  grep -vE "nvdisasm|Source Location|dump.cc|Warning|warn|^$" $OUT/prof_$heads.log | tail -60
done
