"""experiments/tensor_work.py: the Hopper kernels' tensor-core work, counted from their item
plans, against a count made by hand for a selection whose plans are known in closed form; a
trace of another point refused."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.tensor_work import kernel_work
from pallas_kernels.moba import moba_gate


@pytest.mark.parametrize("d", [64, 128])
def test_kernel_work_every_eligible_block(d):
  """One document of four 128-token blocks, one head, every eligible block selected (budget
  4), so block i's run holds its own 128 tokens first, then the 128 of each later block, and
  every sorted row is a real one. A 128-row item runs one 128-key step per half in the forward;
  in dq (64-key tiles at head_dim 128, else 128) a later block's item runs two steps per half
  at 128, an own-block item one for its first half (rows 0-63 end in the first tile) and two
  for its second; below 128 both halves run the item's steps (ping-pong, or no half steps).
  dk/dv takes 64-row chunk steps at 128 (128 below) per 64-key half, the second half skipping
  the own-block rows before its keys (one 64-row step; none of a 128-row step)."""
  t, block, n = 512, 128, 4
  rng = np.random.default_rng()
  q = jnp.asarray(rng.standard_normal((1, t, 1, d)), jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((1, t, 1, d)), jnp.bfloat16)
  seg = jnp.ones((1, t), jnp.int32)
  sel = jax.jit(lambda q, k: moba_gate(q, k, seg, jnp.asarray([n], jnp.int32), block_size=block,
                                       k_max=n))(q, k)
  work = kernel_work(sel, seg, block=block, hq=1, hkv=1, d=d)
  runs = [n - i for i in range(n)]  # blocks of rows in block i's run: its own and later ones
  items = sum(runs)  # one 128-row item per block of rows
  assert work["forward"]["items"] == items
  assert work["forward"]["steps"] == 2 * items
  assert work["forward"]["flops"] == 2 * 2 * (2 * items) * 64 * 128 * d
  if d >= 128:
    dq_steps = n * (1 + 2) + (items - n) * 4
    dq_tile = 64
  else:
    dq_steps, dq_tile = 2 * items, 128
  assert work["dq"]["steps"] == dq_steps
  assert work["dq"]["flops"] == 2 * 3 * dq_steps * 64 * dq_tile * d
  chunk = 64 if d >= 128 else 128
  per_run = [r * block // chunk for r in runs]
  dkv_steps = sum(per_run) + sum(c - (1 if chunk == 64 else 0) for c in per_run)
  assert work["dk/dv"]["items"] == n  # one 128-key tile per block
  assert work["dk/dv"]["steps"] == dkv_steps
  assert work["dk/dv"]["flops"] == 2 * 4 * dkv_steps * 64 * chunk * d


def test_a_trace_of_another_point_is_an_error(tmp_path, monkeypatch):
  """main() refuses a trace whose point differs from the one it counts, naming the field."""
  from experiments import tensor_work
  trace = tmp_path / "trace.json"
  trace.write_text(json.dumps(dict(seq=512, block=128, k=2, heads="tiny", rows=[])))
  monkeypatch.setattr("sys.argv", ["tensor_work", "--seq", "512", "--block", "128", "--k", "3",
                                   "--heads", "tiny", "--trace", str(trace)])
  with pytest.raises(ValueError, match="traced k=2, not --k 3"):
    tensor_work.main()


@pytest.mark.parametrize("traced, argv, message", [
    (dict(batch=2), [], "traced batch=2, not --batch 1"),
    ({}, ["--batch", "2"], "traced batch=1, not --batch 2"),  # a trace before --batch: one row
])
def test_a_trace_of_another_batch_is_an_error(tmp_path, monkeypatch, traced, argv, message):
  from experiments import tensor_work
  trace = tmp_path / "trace.json"
  trace.write_text(json.dumps(dict(seq=512, block=128, k=3, heads="tiny", rows=[], **traced)))
  monkeypatch.setattr("sys.argv", ["tensor_work", "--seq", "512", "--block", "128", "--k", "3",
                                   "--heads", "tiny", "--trace", str(trace), *argv])
  with pytest.raises(ValueError, match=message):
    tensor_work.main()
