# Shared by the kernel device-call scripts (source it; OUT must be set).

# time_headline H128_VARIANT H64_VARIANT: forward+backward of the default tiles and of the given
# variant (bench_kernel.py syntax) beside cuDNN at the headline points: 16/16 x 128, block 512,
# k = 3, 8, 16 (with the GPU correctness check first), and 14/2 x 64, block 256, k = 8, 16.
time_headline() {
  python3 experiments/bench_kernel.py --variants-everywhere --seqs 32768 --blocks 512 \
      --ks 3 8 16 --heads h128 --variants "$1" --out "$OUT/h128.json" > "$OUT/h128.log" 2>&1
  echo "h128: exit $?"
  python3 experiments/bench_kernel.py --skip-check --variants-everywhere --seqs 32768 \
      --blocks 256 --ks 8 16 --heads h64 --variants "$2" --out "$OUT/h64.json" \
      > "$OUT/h64.log" 2>&1
  echo "h64: exit $?"
}
