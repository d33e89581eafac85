"""experiments/bench_kernel.py's variant syntax, pair count and point inputs (the script itself
runs on the GPU machine)."""

import argparse
import types

import numpy as np
import pytest

from experiments.bench_kernel import (add_point_args, attended_pairs, parse_variant,
                                      point_inputs, variant_tag)
from pallas_kernels.moba import MobaBlockSizes


def test_variant_fields():
  bs = parse_variant("64,32,128,4,3")
  assert (bs.block_rows, bs.block_k, bs.block_k_dkv, bs.num_warps, bs.num_stages) == (
      64, 32, 128, 4, 3)
  assert (bs.num_warps_bwd, bs.num_stages_bwd) == (4, 3)  # the backward follows the forward
  assert bs.skip_full_masks is None  # decided by head_dim
  assert parse_variant("64,64,64,4,2,1").skip_full_masks is True
  assert parse_variant("64,64,64,4,2,0").skip_full_masks is False
  assert parse_variant("64,64,64,4,2,a").skip_full_masks is None
  bs = parse_variant("64,64,64,4,2,0,8,1")
  assert (bs.num_warps, bs.num_stages, bs.num_warps_bwd, bs.num_stages_bwd) == (4, 2, 8, 1)
  assert bs.fast_exp2 and not parse_variant("64,64,64,4,2,0,4,2,0").fast_exp2


@pytest.mark.parametrize("text", ["a,64,64,4,2", "64,64,64,4,2,2", "64,64,64,4,2,1,a,2",
                                  "64,64,64,4", "64,64,64,4,2,1,8",
                                  "64,64,64,4,2,1,4,2,a", "64,64,64,4,2,1,4,2,1,1"])
def test_bad_variants_are_refused(text):
  with pytest.raises(ValueError, match="variant"):
    parse_variant(text)


def test_tag_names_the_decided_variant():
  auto = parse_variant("64,64,64,4,2")
  assert variant_tag(auto.fit(256, 64)) == "r64_k64_kd64_w4_s2_skipfull"
  assert variant_tag(auto.fit(512, 128)) == "r64_k64_kd64_w4_s2"
  assert variant_tag(MobaBlockSizes(num_warps_bwd=8, num_stages_bwd=1).fit(512, 128)) == (
      "r64_k64_kd64_w4_s2_bw8_bs1")
  assert variant_tag(parse_variant("64,64,64,4,2,0,4,2,0").fit(512, 128)) == (
      "r64_k64_kd64_w4_s2_libexp2")


def test_attended_pairs_sum_over_rows():
  """Two rows of 8 tokens, blocks of 4: row 0 attends its own blocks only, row 1's second
  block also one earlier block - counted by hand, per query head, times the group."""
  count_BTG = np.ones((2, 8, 1), np.int32)
  count_BTG[1, 4:] = 2
  sel = types.SimpleNamespace(count_BTG=count_BTG)
  own = 2 * (1 + 2 + 3 + 4)  # causal within each block, per row
  assert attended_pairs(sel, block=4, group=1) == 2 * own + 4 * 4
  assert attended_pairs(sel, block=4, group=7) == 7 * (2 * own + 4 * 4)


def test_point_inputs_take_the_batch():
  p = argparse.ArgumentParser()
  add_point_args(p)
  args = p.parse_args(["--seq", "256", "--heads", "tiny", "--k", "2", "--batch", "3"])
  d, q, k, v, do, seg, budget = point_inputs(args)
  assert q.shape == (3, 256, 2, 16) and k.shape == (3, 256, 1, 16) and seg.shape == (3, 256)
  assert budget.tolist() == [2, 2, 2]
  with pytest.raises(ValueError, match="--batch"):
    point_inputs(p.parse_args(["--batch", "0"]))
