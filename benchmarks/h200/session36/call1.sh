#!/usr/bin/env bash
# The layout's ranks by kv_layout.tile_read_ranks at 32 tokens a program on 2 warps (the one
# configuration faster alone than the running count at k_max 3: 0.081 against 0.122 ms, 2026-12-05)
# in the step, against the running count (the default). On the device's copy of the tree: the
# tree as it is kept in /tmp/ab_count; the working tree with attention._TILE_RANKS on and
# kv_layout's TILE_RANK_TOKENS = 32, TILE_RANK_WARPS = 2; the compiled tile ranks' GPU test; the
# traced A/B (two rounds at 16/16 x 128, block 512, top-3; one at 14/2 x 64, block 256, top-8);
# the working tree beside cuDNN at top-3. Sized for the 600 s limit (session33/call1.sh, which
# also ran the other GPU tests and the ranks alone, was cut at it).
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session36/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
tile_ranks_on 32 2 || exit 1
gpu_tests 150 tests/test_kv_layout.py -m gpu -k tile_ranks
HLO=1 TREES="/tmp/ab_count ." ab_pair 2
bench_top3
pack_out
