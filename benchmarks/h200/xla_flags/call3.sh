#!/usr/bin/env bash
# Device call 3: every GPU test on the tree with device_clock.clocked's check of XLA's
# command-buffer scheduling (the shard-timing tests read the real clock).
# Usage on the device: bash benchmarks/h200/xla_flags/call3.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
gpu_tests 400 tests -m gpu --ignore=tests/test_notebook.py
