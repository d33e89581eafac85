#!/usr/bin/env bash
# The layout's ranks by kv_layout.tile_read_ranks (a Triton kernel per 64-token tile, then a
# cumulative sum over the tiles) against the [B, G, T, N] running count (kv_layout._read_ranks,
# the default while attention._TILE_RANKS is False): the GPU tests of the gate, the layout and
# the Hopper kernels on the working tree with the tile ranks on; the ranks alone
# (layout_probe.py: the running count against the kernel's tiles and warps); the traced A/B
# of /tmp/ab_tiles (the working tree with attention._TILE_RANKS = True) against the working
# tree, two rounds at 16/16 x 128, block 512, top-3 (the working tree's first trace with the
# step's HLO) and one at 14/2 x 64, block 256, top-8; /tmp/ab_tiles beside cuDNN at top-3.
# Needs .whl/ carried. Results in $OUT (one tarball).
# Usage on the device: bash benchmarks/h200/session33/call1.sh
set -uo pipefail
OUT=${OUT:?}
source experiments/h200/lib.sh
rm -rf /tmp/ab_tiles && mkdir -p /tmp/ab_tiles
cp -r pallas_kernels experiments sparsebalance_jax tests configs .whl pyproject.toml /tmp/ab_tiles/
sed -i 's/^_TILE_RANKS = False$/_TILE_RANKS = True/' /tmp/ab_tiles/pallas_kernels/moba/attention.py
grep -c "^_TILE_RANKS = True" /tmp/ab_tiles/pallas_kernels/moba/attention.py
(cd /tmp/ab_tiles && OUT=$OUT gpu_tests 300 tests/test_moba_gate.py tests/test_moba_hopper.py \
    -m gpu)
timeout 200 python3 -m experiments.layout_probe --ks 3 8 --no-pieces \
    --only "as committed" "tile kernel" --out "$OUT/layout_probe.json" > "$OUT/layout_probe.log" 2>&1
echo "layout_probe: exit $?"; grep "k_max" "$OUT/layout_probe.log"
HLO=1 TREES=". /tmp/ab_tiles" ab_pair 2
timeout 150 python3 /tmp/ab_tiles/experiments/bench_kernel.py --skip-check --backends mosaic \
    --seqs 32768 --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_tiles_step.json" \
    > "$OUT/h128_tiles_step.log" 2>&1
echo "bench ab_tiles h128: exit $?"; grep -A3 "^kind " "$OUT/h128_tiles_step.log"
pack_out
