#!/usr/bin/env bash
# one-off device call: the main job's step traced at the working tree and at ab_base, then the
# kernels at the model's shape beside cuDNN
set -u
T="--config=configs/longbench.py --meshes=1x1x1 --steps=3 --warmup=2"
timeout 200 python3 -m experiments.trace_train $T --out=$OUT/train_work.json > $OUT/train_work.log 2>&1
echo "work: exit $?"; grep -E "wall|^  (moba|xla|matmul)" $OUT/train_work.log | head -5
grep -A12 "^host events" $OUT/train_work.log
(cd ab_base && timeout 200 python3 -m experiments.trace_train --config=../configs/longbench.py --meshes=1x1x1 --steps=3 --warmup=2 --out=$OUT/train_base.json > $OUT/train_base.log 2>&1; echo "base: exit $?")
grep -E "wall" $OUT/train_base.log
timeout 200 python3 experiments/bench_kernel.py --skip-check --backends triton mosaic --seqs 32768 --blocks 512 --ks 3 4 8 --heads h64 --out $OUT/h64_b512.json > $OUT/h64_b512.log 2>&1
echo "bench h64: exit $?"; grep -A12 "^kind " $OUT/h64_b512.log | head -20
