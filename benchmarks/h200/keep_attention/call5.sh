#!/usr/bin/env bash
# The GPU preset's train step (remat_keep as the preset) with XLA's dynamic-slice fusion on
# (--xla_gpu_enable_dynamic_slice_fusion: library calls such as cuBLAS GEMMs write into, and read
# from, slices of the layers' scan's stacked buffers in place), beside the default: median step
# and peak memory (ablate_meshes.py), then traced. Needs .whl/ carried. Results in $OUT.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
use_wheels || exit 1
for flags in "" "--xla_gpu_enable_dynamic_slice_fusion=true"; do
  name=${flags:+dsf}; name=${name:-default}
  XLA_FLAGS="$flags" timeout 150 python3 -m experiments.ablate_meshes \
      --config=configs/longbench.py --meshes=1x1x1 --steps=5 --warmup=2 \
      --out="$OUT/ablate_$name" > "$OUT/ablate_$name.log" 2>&1
  echo "ablate_meshes XLA_FLAGS='$flags': exit $?"
  head -1 "$OUT/ablate_$name.log"
done
XLA_FLAGS="--xla_gpu_enable_dynamic_slice_fusion=true" timeout 170 python3 -m \
    experiments.trace_train --config=configs/longbench.py --meshes=1x1x1 --steps=3 \
    --out="$OUT/trace_dsf.json" > "$OUT/trace_dsf.log" 2>&1
echo "trace_train (dynamic-slice fusion): exit $?"
grep -A 16 'tokens per step' "$OUT/trace_dsf.log" | grep -E 'tokens per step|memcpy|xla_other|matmul|moba_pallas'
