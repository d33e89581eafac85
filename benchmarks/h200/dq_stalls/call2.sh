#!/usr/bin/env bash
# Device call 2 (2026-12-02): the accumulators kept in wgmma accumulators for a whole item -
# dq's (ab_dq: HEAD's kernels with the working tree's rows.py), and dq's and dk/dv's (the
# working tree) - against HEAD's kernels (ab_base: `git archive HEAD pallas_kernels
# experiments | tar -x -C ab_base`): the traced step at 16/16 x 128, top-3, two rounds each,
# every kernel's PTX kept (for sass_lines.py), the GPU tests and the time beside cuDNN (both
# on the working tree, the tried change). Everything comes back in one tarball. The working
# tree was HEAD (a26744a) with resident_accumulators.patch applied; ab_dq, with its rows.py
# part only.
set -uo pipefail
OUT=${OUT:?}
TREES="ab_base ab_dq ." ROUNDS=2 PTX=1 STEP=1 KS=3 bash experiments/h200/ab_call.sh 2>&1 \
    | tee "$OUT/call.log" | tail -45
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
