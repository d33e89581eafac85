#!/usr/bin/env bash
# The kernels' GPU tests after the test-suite review (budgets always ragged, check_device's
# host-device rule for interpret mode on CPU), and the config tests on a GPU process (cuDNN and
# compiled Pallas kernels accepted there). Needs .whl/ carried. Results in $OUT.
# Usage on the device: bash benchmarks/h200/scan_layers/call9.sh
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?}"
source experiments/h200/lib.sh
gpu_tests 400 tests/test_moba_kernel.py tests/test_moba_hopper.py tests/test_moba_gate.py \
    -m gpu || exit 1
mv "$OUT/gpu_tests.log" "$OUT/gpu_tests_kernels.log"
gpu_tests 200 tests/test_config.py
