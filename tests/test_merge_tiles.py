"""experiments/merge_tiles.py's count of the bytes a merge must move."""

import jax.numpy as jnp

from experiments.merge_tiles import merge_bytes


def test_merge_bytes_counts_used_slots_once_and_the_output():
  # 2 tokens x 3 query heads in one KV group (count per (token, group)), d = 4 in bf16.
  part = jnp.zeros((1, 1, 256, 4), jnp.bfloat16)
  count_BTG = jnp.asarray([[[2], [1]]], jnp.int32)
  used_rows = 3 * 3  # (2 + 1) slots, each the group's 3 heads
  assert merge_bytes(part, count_BTG, 2, 3, forward=False) == (used_rows + 2 * 3) * 4 * 2
  assert merge_bytes(part, count_BTG, 2, 3, forward=True) == (used_rows + 2 * 3) * (4 * 2 + 4)


def test_merge_bytes_count_every_row_of_the_batch():
  # Two rows of 2 tokens x 3 query heads, d = 4 in bf16: both rows' slots and outputs.
  part = jnp.zeros((2, 1, 256, 4), jnp.bfloat16)
  count_BTG = jnp.asarray([[[2], [1]], [[1], [1]]], jnp.int32)
  used_rows = (3 + 2) * 3
  assert merge_bytes(part, count_BTG, 2, 3, forward=False) == (used_rows + 2 * 2 * 3) * 4 * 2
