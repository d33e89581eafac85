"""The KV-centric layout built from a gate's selection (kv_layout): its rows, runs, chunks and
the ranks that place them, by the running count and by the tile kernel."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.moba import gating, kv_layout, moba_gate
from tests.test_moba_gate import _inputs, packed_segments


def test_full_chunks_attend_every_pair():
  """chunk_full_BGC marks a used chunk exactly where every (row, key of its block) pair is
  attended. (An own-block chunk could only be all-attended if all its rows held the block's last
  token; with 16 rows of 2 heads a chunk holds 8 tokens, so that cannot arise here.)"""
  rng = np.random.default_rng()
  b, t, block_size, r = 2, 512, 32, 16
  q, k = _inputs(rng, b=b, t=t)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(rng.integers(2)))
  sel = moba_gate(q, k, seg, jnp.asarray([4, 3], jnp.int32), block_size=block_size, k_max=4)
  lay = kv_layout.build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2, block_rows=r)
  seg_np = np.asarray(seg)
  full = np.asarray(lay.chunk_full_BGC)
  cb = np.asarray(lay.chunk_block_BGC)
  for bi, gi, c in zip(*np.nonzero(cb >= 0)):
    j = cb[bi, gi, c]
    rseg = np.asarray(lay.row_seg_BGL)[bi, gi, c * r:(c + 1) * r]
    rpos = np.asarray(lay.row_pos_BGL)[bi, gi, c * r:(c + 1) * r]
    kseg = seg_np[bi, j * block_size:(j + 1) * block_size]
    kpos = np.arange(j * block_size, (j + 1) * block_size)
    attended = ((rseg[:, None] == kseg[None, :]) & (rseg[:, None] != 0)
                & (kpos[None, :] <= rpos[:, None]))
    assert full[bi, gi, c] == attended.all(), (bi, gi, c)
  assert np.all(full[cb < 0] == 0)
  assert full.sum() > 0 and (full == 0).sum() > 0

  # Without marks (kernels that mask every chunk) the flag is all zero; nothing else changes.
  plain = kv_layout.build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2,
                                    block_rows=r, mark_full=False)
  assert not np.asarray(plain.chunk_full_BGC).any()
  for field in ("row_src_BGL", "row_seg_BGL", "row_pos_BGL", "entry_row_BGTK", "chunk_block_BGC",
                "block_chunks_BGN2"):
    np.testing.assert_array_equal(np.asarray(getattr(plain, field)),
                                  np.asarray(getattr(lay, field)))


@pytest.mark.parametrize("tile, ignore_padding", [(8, False), (8, True), (16, True)])
def test_attended_key_tiles_are_attended_whole(tile, ignore_padding):
  """attended_key_tiles: every (row, key) pair of a chunk's leading tiles is attended (padding
  rows aside when ignored), and where the chunk's rows share the document of an unmixed block
  the count is exact: the next tile is not attended whole."""
  rng = np.random.default_rng()
  b, t, block_size, r = 2, 512, 32, 16
  q, k = _inputs(rng, b=b, t=t)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(rng.integers(2)))
  sel = moba_gate(q, k, seg, jnp.asarray([4, 3], jnp.int32), block_size=block_size, k_max=4)
  lay = kv_layout.build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2,
                                  block_rows=r, mark_full=False, pad_rows=2 * r)
  cb = np.asarray(lay.chunk_block_BGC)
  tiles = np.asarray(kv_layout.attended_key_tiles(
      lay.chunk_block_BGC, lay.row_seg_BGL, lay.row_pos_BGL, seg, num_blocks=t // block_size,
      block_rows=r, tile=tile, ignore_padding_rows=ignore_padding))
  seg_np = np.asarray(seg)
  exact = 0
  for bi, gi, c in zip(*np.nonzero(cb >= 0)):
    j = cb[bi, gi, c]
    rseg = np.asarray(lay.row_seg_BGL)[bi, gi, c * r:(c + 1) * r]
    rpos = np.asarray(lay.row_pos_BGL)[bi, gi, c * r:(c + 1) * r]
    if ignore_padding:
      rseg, rpos = rseg[rseg != 0], rpos[rseg != 0]
    kseg = seg_np[bi, j * block_size:(j + 1) * block_size]
    kpos = np.arange(j * block_size, (j + 1) * block_size)
    whole = ((rseg[:, None] == kseg[None, :]) & (rseg[:, None] != 0)
             & (kpos[None, :] <= rpos[:, None])).all(0).reshape(-1, tile).all(-1)
    u = tiles[bi, gi, c]
    assert whole[:u].all(), (bi, gi, c, u)
    if len(rseg) and len(set(rseg)) == 1 and rseg[0] != 0 and (kseg == rseg[0]).all():
      assert u == len(whole) or not whole[u], (bi, gi, c, u)
      exact += 1
  assert np.all(tiles[cb < 0] == 0)
  assert exact > 0 and 0 < tiles.max() and (tiles[cb >= 0] < block_size // tile).any()


def test_layout_arguments_are_checked():
  """build_kv_layout (public) names what does not fit the selection, where it had failed in
  a reshape or returned rows past q's."""
  rng = np.random.default_rng()
  q, k = _inputs(rng)
  seg = jnp.ones((2, 128), jnp.int32)
  sel = moba_gate(q, k, seg, jnp.asarray([3, 2], jnp.int32), block_size=16, k_max=3)
  for kwargs, match in ((dict(num_blocks=9), "num_blocks=9 must divide the selection's T=128"),
                        (dict(group_size=0), "group_size=0"),
                        (dict(block_rows=0), "block_rows=0")):
    args = {**dict(num_blocks=8, group_size=2, block_rows=16), **kwargs}
    with pytest.raises(ValueError, match=re.escape(match)):
      kv_layout.build_kv_layout(sel, seg, **args)
  with pytest.raises(ValueError, match=r"segment_ids_BT must be \[B=2, T=128\]"):
    kv_layout.build_kv_layout(sel, seg[:1], num_blocks=8, group_size=2, block_rows=16)


def test_layout_padded_to_wider_runs():
  """pad_rows: every run of pad_rows rows reads one block, chunks of padding only are unused,
  and each (token, slot, head) still has exactly one row holding it."""
  rng = np.random.default_rng()
  b, t, block_size, r, pad = 2, 512, 32, 16, 64
  q, k = _inputs(rng, b=b, t=t)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(rng.integers(2)))
  sel = moba_gate(q, k, seg, jnp.asarray([4, 2], jnp.int32), block_size=block_size, k_max=4)
  lay = kv_layout.build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2,
                                  block_rows=r, pad_rows=pad)
  cb = np.asarray(lay.chunk_block_BGC)
  has_tok = (np.asarray(lay.row_seg_BGL) != 0).reshape(*cb.shape, r).any(-1)
  assert np.all((cb >= 0) <= has_tok)  # a used chunk holds a real row
  runs = cb.reshape(*cb.shape[:2], -1, pad // r)
  first = runs[..., :1]
  assert np.all((runs == first) | (runs < 0))  # one block per pad_rows run
  assert (cb < 0).any() and ((runs[..., 0] >= 0) & (runs[..., -1] < 0)).any()  # padding chunks
  assert lay.run_rows == pad and np.all(np.asarray(lay.block_chunks_BGN2) * r % pad == 0)
  # Every used slot's rows hold its (token, head): 4 query heads, KV groups of 2.
  src = np.asarray(lay.row_src_BGL)
  entry = np.asarray(lay.entry_row_BGTK)
  used = np.transpose(np.asarray(sel.selected_BTGK), (0, 2, 1, 3)) < t // block_size
  for bi, gi, ti, si in zip(*np.nonzero(used)):
    for h in range(2):
      assert src[bi, gi, entry[bi, gi, ti, si] + h] == ti * 4 + gi * 2 + h
  # Within a block's run the rows are in position order (heads of one token together).
  pos, seg_rows = np.asarray(lay.row_pos_BGL), np.asarray(lay.row_seg_BGL)
  row_block = np.repeat(cb, r, axis=-1)
  for bi in range(b):
    for gi in range(2):
      for j in np.unique(row_block[bi, gi][row_block[bi, gi] >= 0]):
        run = pos[bi, gi][(row_block[bi, gi] == j) & (seg_rows[bi, gi] != 0)]
        assert np.all(np.diff(run) >= 0) and np.all(np.bincount(run - run.min()) <= 2)
  with pytest.raises(ValueError, match="pad_rows"):
    kv_layout.build_kv_layout(sel, seg, num_blocks=t // block_size, group_size=2,
                              block_rows=r, pad_rows=24)


def test_read_ranks_equal_over_count_chunks():
  """kv_layout._read_ranks counts the same ranks whatever its token chunk (down to 32, up to
  the 256 its bf16 counts hold exactly), and refuses a chunk whose counts would not be exact."""
  rng = np.random.default_rng()
  b, t, block_size = 2, 1024, 32
  q, k = _inputs(rng, b=b, t=t)
  seg = packed_segments(rng, b, t, block_size, aligned=False)
  sel = moba_gate(q, k, seg, jnp.asarray([5, 3], jnp.int32), block_size=block_size, k_max=5)
  sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
  n = t // block_size
  used = np.asarray(sel_BGTK < n)
  want_rank, want_total = kv_layout._read_ranks(sel_BGTK, n)
  # Each used (token, slot)'s rank: its block's earlier readers, counted directly.
  sel_np = np.asarray(sel_BGTK)
  for bi, gi, ti, si in zip(*np.nonzero(used)):
    earlier = (sel_np[bi, gi, :ti] == sel_np[bi, gi, ti, si]).any(-1).sum()
    assert want_rank[bi, gi, ti, si] == earlier
  for chunk in (32, 64, 256):
    rank, total = kv_layout._read_ranks(sel_BGTK, n, chunk=chunk)
    np.testing.assert_array_equal(np.asarray(rank)[used], np.asarray(want_rank)[used])
    np.testing.assert_array_equal(total, want_total)
  with pytest.raises(ValueError, match="chunk=512"):
    kv_layout._read_ranks(sel_BGTK, n, chunk=512)


@pytest.mark.parametrize("block_size, tile, k_max", [(64, 32, 3), (32, 64, 4), (64, 64, 8),
                                                      (128, 16, 2)])
def test_tile_read_ranks_equal_running_count(block_size, tile, k_max):
  """kv_layout.tile_read_ranks (its kernel in interpret mode) gives _read_ranks' ranks on every
  used slot and its reader counts, with packed documents, padding and ragged budgets - tiles
  inside one block (own slots compared apart) and tiles across blocks (32 < 64) alike."""
  rng = np.random.default_rng()
  b, t = 2, 1024
  q, k = _inputs(rng, b=b, t=t)
  seg = packed_segments(rng, b, t, block_size, aligned=bool(rng.integers(2)))
  budget = jnp.asarray(rng.integers(1, k_max + 1, b), jnp.int32)
  sel = moba_gate(q, k, seg, budget, block_size=block_size, k_max=k_max)
  n = t // block_size
  sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
  used = np.asarray(sel_BGTK < n)
  want_rank, want_total = kv_layout._read_ranks(sel_BGTK, n)
  rank, total = kv_layout.tile_read_ranks(sel.selected_BTGK, n, block_size=block_size,
                                          interpret=True, tile=tile)
  np.testing.assert_array_equal(np.asarray(rank)[used], np.asarray(want_rank)[used])
  np.testing.assert_array_equal(np.asarray(total), np.asarray(want_total))
  assert used.sum() > b * t  # picks beyond the own blocks were ranked


def test_layout_from_tile_ranks_is_the_same():
  """build_kv_layout(tile_ranks=True) builds the running count's layout, field by field."""
  rng = np.random.default_rng()
  b, t, block_size = 2, 512, 64
  q, k = _inputs(rng, b=b, t=t)
  seg = packed_segments(rng, b, t, block_size, aligned=False)
  sel = moba_gate(q, k, seg, jnp.asarray([4, 2], jnp.int32), block_size=block_size, k_max=4)
  kw = dict(num_blocks=t // block_size, group_size=2, block_rows=16, pad_rows=32)
  want = kv_layout.build_kv_layout(sel, seg, **kw)
  got = kv_layout.build_kv_layout(sel, seg, tile_ranks=True, interpret=True, **kw)
  for field in ("row_src_BGL", "row_seg_BGL", "row_pos_BGL", "entry_row_BGTK", "chunk_block_BGC",
                "chunk_full_BGC", "block_chunks_BGN2"):
    np.testing.assert_array_equal(np.asarray(getattr(got, field)),
                                  np.asarray(getattr(want, field)), err_msg=field)


def test_tile_read_ranks_refuses_what_it_cannot_take():
  sel = jnp.zeros((1, 256, 2, 3), jnp.int32)
  with pytest.raises(ValueError, match="at most 8 slots"):
    kv_layout.tile_read_ranks(jnp.zeros((1, 256, 2, 9), jnp.int32), 4, block_size=64,
                              interpret=True)
  with pytest.raises(ValueError, match="tile=48"):
    kv_layout.tile_read_ranks(sel, 4, block_size=64, interpret=True, tile=48)
  with pytest.raises(ValueError, match="dividing T=256"):
    kv_layout.tile_read_ranks(sel, 4, block_size=64, interpret=True, tile=512)
  assert kv_layout.tile_ranks_fit(32768, 8) and not kv_layout.tile_ranks_fit(32768, 9)
  assert not kv_layout.tile_ranks_fit(1000, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size, k_max", [(512, 3), (512, 8), (256, 4)])
def test_gpu_compiled_tile_ranks_equal_running_count(block_size, k_max):
  """The compiled tile_read_ranks kernel at S=32K, 16 KV groups (the headline's shape) gives
  _read_ranks' ranks and counts: one document per row, and packed documents with padding."""
  rng = np.random.default_rng()
  b, t, hq, d = 2, 32768, 16, 64
  n = t // block_size
  q = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.bfloat16)
  seg = jnp.stack([jnp.ones((t,), jnp.int32),
                   packed_segments(rng, 1, t, 4 * block_size, aligned=False)[0]])
  budget = jnp.asarray([k_max, 2], jnp.int32)
  sel = gating.fused_gate(q, k, seg, budget, block_size=block_size, k_max=k_max,
                          interpret=False)
  sel_BGTK = jnp.transpose(sel.selected_BTGK, (0, 2, 1, 3))
  used = np.asarray(sel_BGTK < n)
  want_rank, want_total = jax.jit(kv_layout._read_ranks, static_argnums=1)(sel_BGTK, n)
  rank, total = jax.jit(lambda s: kv_layout.tile_read_ranks(
      s, n, block_size=block_size, interpret=False))(sel.selected_BTGK)
  np.testing.assert_array_equal(np.asarray(rank)[used], np.asarray(want_rank)[used])
  np.testing.assert_array_equal(np.asarray(total), np.asarray(want_total))
