#!/usr/bin/env bash
# Device call 4: the compiled Hopper GPU test after the forward's and dq's schedules and dk/dv's
# chunk rows moved into forward_schedule, dq_schedule and dkv_chunk_rows (same values).
# Usage on the device: bash benchmarks/h200/issue_ahead/call4.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 170 tests/test_moba_hopper.py -m gpu
