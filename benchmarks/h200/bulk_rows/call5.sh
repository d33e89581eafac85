#!/usr/bin/env bash
# Device call 5 of the bulk row copies: call 4's A/B in two rounds at 16/16 x 128, block 512,
# top-3, and one at 14/2 x 64, block 256, top-8 (ab_base as in call4.sh, carried).
# Usage on the device: bash benchmarks/h200/bulk_rows/call5.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
ab_pair 2
pack_out
