#!/usr/bin/env bash
# Device call 1: the forward's conditional rescaling (rows.py: _lazy_max, a key step rescales
# the output only where some row's maximum rose past the slack). The Hopper GPU tests on the
# working tree; the traced A/B against ab_base (HEAD's kernels) at 16/16 x 128, block 512,
# top-3 (two rounds, PTX kept) and 14/2 x 64, block 256, top-8 (one round); the working tree
# beside cuDNN at the top-3 point.
# Usage on the device: bash benchmarks/h200/lazy_rescale/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
kernel_ab 170
