#!/usr/bin/env bash
# With dq's merge output pinned row-major (in the tree since 204030f): every GPU-marked test
# (the Triton and Hopper kernels compiled, the gate, the shard timing), then the top-3 point
# beside cuDNN (bench_top3). Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/scan_layers/call8.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
gpu_tests 300 tests/test_moba_kernel.py tests/test_moba_hopper.py tests/test_moba_gate.py \
    tests/test_shard_timing.py -m gpu || exit 1
bench_top3
pack_out
