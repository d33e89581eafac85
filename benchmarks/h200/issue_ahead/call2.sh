#!/usr/bin/env bash
# Device call 2: every GPU-marked test on the tree with dkv_chunk_steps split out of moba_dkv
# (a refactor of dk/dv's item plan; the kernels are unchanged).
# Usage on the device: bash benchmarks/h200/issue_ahead/call2.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 400 tests -m gpu --ignore=tests/test_notebook.py
