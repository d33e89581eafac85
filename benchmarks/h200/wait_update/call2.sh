#!/usr/bin/env bash
# Device call 2: the forward's issue_ahead schedule at head_dim 128 (each ping-pong turn issues
# a key step's P V with the next step's q K^T, both waited for before the next softmax; the
# next S, not P, is carried round the loop), as call 1: the Hopper GPU test on the working
# tree, the traced A/B against ab_base (HEAD before it, carried; PTX kept) at both headline
# points, and the working tree beside cuDNN at the top-3 point.
# Usage on the device: bash benchmarks/h200/wait_update/call2.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
kernel_ab 150
