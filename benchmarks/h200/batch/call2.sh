#!/usr/bin/env bash
# Device call 2: every GPU test on the session's final tree (the kernels are HEAD's; the
# benchmark scripts take --batch), the notebook's aside.
# Usage on the device: bash benchmarks/h200/batch/call2.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 420 tests -m gpu --ignore=tests/test_notebook.py
