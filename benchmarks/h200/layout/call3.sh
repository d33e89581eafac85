#!/usr/bin/env bash
# Device call 3 (prepared in the eighth 2026-12-01 session, run in the ninth: not kept, see
# BENCHMARKS.md). The layout's read ranks counted by a small kernel of their own
# (kernels.moba_read_ranks: 32 tokens a program, 48 registers per thread at k_max 3 compiled
# on the CPU), leaving the gate kernel as it is, against the committed code: call 2's A/B and
# GPU test (call2.sh, working tree against ab_base) on the working tree with the patch applied.
# Before the call, on this machine:
#   git apply benchmarks/h200/layout/read_ranks_kernel.patch
#   mkdir ab_base && git archive HEAD pallas_kernels experiments | tar -x -C ab_base
# then `bash benchmarks/h200/layout/call3.sh` on the device (after installing .whl/). Adopt the
# patch if the step's kernels fall at 16/16 x 128 under k_max 3 and 16 and do not rise at 14/2
# x 64 (call 2: the XLA ranks it replaces cost 0.086 / 0.097 / 0.015 ms there).
set -uo pipefail
[ -d ab_base ] || { echo "make ab_base first (see the header)"; exit 1; }
exec bash "$(dirname "$0")/call2.sh"
