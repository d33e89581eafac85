#!/usr/bin/env bash
# One device call comparing the Hopper kernels of several source trees (TREES: folders holding a
# version's pallas_kernels/ and experiments/, "." the working tree), e.g. a base commit's:
#   git archive <commit> pallas_kernels experiments sparsebalance_jax | tar -x -C ab_base
#   TREES="ab_base ." bash experiments/h200/ab_call.sh
# (a base tree must reach the device: untracked and not ignored by git, or named in the call's
# carry)
# MODE=trace (default): the GPU time of every kernel of a top-3 forward+backward step
# (trace_moba.py, 16/16 x 128, S=32K, block 512; TRACE_ARGS overrides the point, e.g.
# "--heads h64 --block 512 --k 3"); MODE=alone: the kernels timed alone
# (persistent_forward.py ALONE_ARGS). The trees run in alternating processes, ROUNDS times
# each, so that the spread from one process to the next shows beside the change. The first
# round keeps every kernel's ptxas report (registers, spills, wgmma serialization: C75xx).
# STEP=1 then runs the working tree's GPU tests and its time beside cuDNN at k in KS (3).
# HLO=1: the working tree's first trace also writes the step's optimized HLO to $OUT/hlo/.
# PTX=1: the first round also keeps every kernel's PTX, $OUT/ptx/<tree>_<kernel>.ptx (for
# sass_lines.py: instructions per source line).
# Last, a table per trace (trace_table.py): kernel time, GPU span and its idle part, forward /
# dq / dk/dv / gate, the gating alone.
set -uo pipefail
OUT=${OUT:?set OUT to a writable directory}
TREES=${TREES:?set TREES to the source trees to compare}
export PYTHONUNBUFFERED=1
ROUNDS=${ROUNDS:-2}
MODE=${MODE:-trace}
ALONE_ARGS=${ALONE_ARGS:-"--configs 128,2,0 --dq-configs 64,3/2,1,1,1 --dkv-stages 2"}
TRACE_ARGS=${TRACE_ARGS:-"--heads h128 --block 512 --k 3"}
for r in $(seq "$ROUNDS"); do
  for tree in $TREES; do
    tag=$(basename "$(realpath "$tree")")
    [ "$tree" = . ] && tag=work
    dump=()
    hlo=()
    [ "${HLO:-0}" = 1 ] && [ "$r" = 1 ] && [ "$tree" = . ] && hlo=(--hlo "$OUT/hlo")
    if [ "$r" = 1 ]; then
      mkdir -p "/tmp/dump_$tag"  # Mosaic GPU writes no dump into a folder that does not exist
      dump=(env MOSAIC_GPU_DUMP_TO="/tmp/dump_$tag" MOSAIC_GPU_DUMP_PTXAS=1)
      [ "${PTX:-0}" = 1 ] && dump+=(MOSAIC_GPU_DUMP_PTX=1)
    fi
    if [ "$MODE" = trace ]; then
      # shellcheck disable=SC2086
      "${dump[@]}" timeout 120 python3 "$tree/experiments/trace_moba.py" $TRACE_ARGS \
          --backend mosaic --reps 10 --out "$OUT/trace_${tag}_$r.json" "${hlo[@]}" \
          > "/tmp/run_${tag}_$r.log" 2>&1
      echo "trace $tag round $r: exit $?"
      grep -vE "nvdisasm|Source Location|dump.cc|^$" "/tmp/run_${tag}_$r.log" | head -9 \
          | sed "s/^/$tag$r /" >> "$OUT/runs.txt"
    else
      # shellcheck disable=SC2086
      "${dump[@]}" timeout 200 python3 "$tree/experiments/persistent_forward.py" $ALONE_ARGS \
          --out "$OUT/alone_${tag}_$r.json" > "/tmp/run_${tag}_$r.log" 2>&1
      echo "alone $tag round $r: exit $?"
      grep -A20 "^kernel " "/tmp/run_${tag}_$r.log" | sed "s/^/$tag$r /" >> "$OUT/runs.txt"
    fi
  done
done
# Per kernel: registers, spills and message codes (ptxas.txt), and the full text of every message
# with a code (ptxas_messages.txt; C75xx: wgmma serialization and the like).
: > "$OUT/ptxas_messages.txt"
for tree in $TREES; do
  tag=$(basename "$(realpath "$tree")"); [ "$tree" = . ] && tag=work
  for f in /tmp/dump_"$tag"/*.ptxas; do
    [ -e "$f" ] || continue
    echo "$tag $(basename "$f"): $(grep -oE 'Used [0-9]+ registers|[0-9]+ bytes spill stores|C75[0-9]+' "$f" \
        | sort -u | tr '\n' ' ')"
    grep -h "C75" "$f" | sort -u | sed "s/^/$tag $(basename "$f"): /" >> "$OUT/ptxas_messages.txt"
  done
  if [ "${PTX:-0}" = 1 ]; then
    mkdir -p "$OUT/ptx"
    for f in /tmp/dump_"$tag"/*.ptx; do
      [ -e "$f" ] && cp "$f" "$OUT/ptx/${tag}_$(basename "$f")"
    done
  fi
done | tee "$OUT/ptxas.txt"
if [ "${STEP:-0}" = 1 ]; then
  timeout 200 python3 -m pytest tests/test_moba_hopper.py -m gpu -p no:cacheprovider \
      > "$OUT/pytest.txt" 2>&1
  echo "pytest -m gpu: exit $? ($(grep -E 'passed|failed|error' "$OUT/pytest.txt" | tail -1))"
  timeout 240 python3 experiments/bench_kernel.py --skip-check --backends mosaic --seqs 32768 \
      --blocks 512 --ks ${KS:-3} --heads h128 --out "$OUT/h128.json" > "$OUT/h128.log" 2>&1
  echo "h128: exit $?"; grep -A6 "^kind " "$OUT/h128.log"
fi
echo "== per run =="
cat "$OUT/runs.txt"
if [ "$MODE" = trace ]; then
  echo "== per trace (ms per step) =="
  python3 "$(dirname "$0")/trace_table.py" "$OUT"/trace_*.json
fi
