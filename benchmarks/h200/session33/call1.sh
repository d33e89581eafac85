#!/usr/bin/env bash
# The layout's ranks by kv_layout.tile_read_ranks (a Triton kernel per 64-token tile, then a
# cumulative sum over the tiles) against the [B, G, T, N] running count (kv_layout._read_ranks,
# the default while attention._TILE_RANKS is False). On the device's copy of the tree the
# script first keeps the tree as it is in /tmp/ab_count, then turns the tile ranks on in the
# working tree (attention._TILE_RANKS = True), and runs: the GPU tests of the gate, the layout,
# the Triton kernels (float32 dots in IEEE float32, at the float32 bounds) and the Hopper
# kernels; the ranks alone (layout_probe.py: the running count against the
# kernel at 32, 64 and 128 tokens on 2, 4 and 8 warps); the traced A/B of the working tree
# against /tmp/ab_count, two rounds at 16/16 x 128, block 512, top-3 (the working tree's first
# trace with the step's HLO) and one at 14/2 x 64, block 256, top-8; the working tree beside
# cuDNN at the top-3 point.
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session33/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
rm -rf /tmp/ab_count && mkdir -p /tmp/ab_count
cp -r pallas_kernels experiments sparsebalance_jax /tmp/ab_count/
sed -i 's/^_TILE_RANKS = False$/_TILE_RANKS = True/' pallas_kernels/moba/attention.py
grep -c "^_TILE_RANKS = True" pallas_kernels/moba/attention.py || exit 1
gpu_tests 360 tests/test_moba_gate.py tests/test_moba_hopper.py tests/test_moba_kernel.py -m gpu
timeout 200 python3 -m experiments.layout_probe --ks 3 8 --no-pieces \
    --only "as committed" "tile kernel" --out "$OUT/layout_probe.json" > "$OUT/layout_probe.log" 2>&1
echo "layout_probe: exit $?"; grep "k_max" "$OUT/layout_probe.log"
HLO=1 TREES="/tmp/ab_count ." ab_pair 2
bench_top3
pack_out
