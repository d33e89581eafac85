#!/usr/bin/env bash
# Device call 3: the forward's compute warpgroups offset by one product at each item's start
# (`lead`: warpgroup 1 starts its key steps once warpgroup 0 has its first S; no turns after
# that), the default at head_dim 128: the Hopper GPU test on the working tree, then the traced
# A/B against ab_base (2605430, carried) at both headline points.
# Usage on the device: bash benchmarks/h200/wait_update/call3.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 150 tests/test_moba_hopper.py -m gpu
ab_pair 2
pack_out
