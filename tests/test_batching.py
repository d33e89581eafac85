"""Batchers: exactly-once over an epoch, determinism, resume, capacity errors, balance."""

import json

import grain
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsebalance_jax.balance.latency import AnalyticLatencyModel, LayerShape
from sparsebalance_jax.data import batching

ALIGN = 16
COST = AnalyticLatencyModel(LayerShape(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16,
                                       mlp_dim=128, block_size=ALIGN))


def _doc(doc_id: int, n: int) -> dict:
    # Every token carries its document id, so packed rows can be traced back to documents.
    return {"inputs": np.full(n, doc_id, np.int32), "targets": np.full(n, doc_id, np.int32),
            "loss_mask": np.ones(n, np.float32)}


def _batcher(lengths, name, *, shards=2, micro=2, rows=2, row_len=64, window=2, seed=0):
    docs = [_doc(i + 1, int(n)) for i, n in enumerate(lengths)]  # ids from 1: 0 is PAD
    parent = grain.MapDataset.source(docs).to_iter_dataset()
    return batching.make_batcher(name, parent, num_shards=shards, micro_batches=micro,
                                 rows_per_micro_batch=rows, row_len=row_len, align=ALIGN,
                                 base_budget=2, window=window, cost_model=COST, seed=seed)


def _check_step_shapes(step, shards, micro, rows, row_len):
    for key in ("inputs", "targets", "loss_mask", "segment_ids", "positions"):
        assert step[key].shape == (shards, micro, rows, row_len), key
    assert step["budgets"].shape == (shards, micro, rows) and step["budgets"].dtype == np.int32
    assert step["predicted_seconds"].shape == (shards, micro)


def _tokens_per_doc(steps) -> dict[int, int]:
    """Document id -> tokens found in the packed rows (checks segments are contiguous docs)."""
    seen: dict[int, int] = {}
    for step in steps:
        inputs, seg = step["inputs"], step["segment_ids"]
        for idx in zip(*np.nonzero(seg.max(axis=-1) > 0)):
            row_inputs, row_seg = inputs[idx], seg[idx]
            for segment in np.unique(row_seg[row_seg > 0]):
                ids = np.unique(row_inputs[row_seg == segment])
                assert len(ids) == 1  # one document per segment
                doc = int(ids[0])
                assert doc not in seen, f"document {doc} emitted twice"
                seen[doc] = int((row_seg == segment).sum())
    return seen


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=60),
       shards=st.integers(1, 4), micro=st.integers(1, 3), window=st.integers(1, 3),
       name=st.sampled_from(batching.BATCHERS), seed=st.integers(0, 2**16))
def test_every_document_exactly_once(lengths, shards, micro, window, name, seed):
    steps = list(_batcher(lengths, name, shards=shards, micro=micro, window=window, seed=seed))
    for step in steps:
        _check_step_shapes(step, shards, micro, 2, 64)
    assert _tokens_per_doc(steps) == {i + 1: n for i, n in enumerate(lengths)}
    ids = np.concatenate([s["doc_ids"].ravel() for s in steps])
    assert np.array_equal(np.sort(ids[ids >= 0]), np.arange(len(lengths)))


@pytest.mark.parametrize("name", batching.BATCHERS)
def test_deterministic_given_seed(name):
    lengths = np.random.default_rng().integers(1, 64, size=80)
    a = [s["doc_ids"] for s in _batcher(lengths, name, seed=3)]
    b = [s["doc_ids"] for s in _batcher(lengths, name, seed=3)]
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    if name != "sab":  # sab's plan depends on costs only (ties aside), not on the seed
        c = [s["doc_ids"] for s in _batcher(lengths, name, seed=4)]
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("name", batching.BATCHERS)
def test_resume_mid_epoch_matches_uninterrupted(name):
    lengths = np.random.default_rng().integers(1, 64, size=90)
    ds = _batcher(lengths, name, window=3)
    full = list(ds)
    assert len(full) > 4
    for cut in (1, 3, len(full) - 1):
        it = iter(ds)
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(it.get_state()))  # checkpoints store it as JSON
        resumed = iter(ds)
        resumed.set_state(state)
        rest = list(resumed)
        assert len(rest) == len(full) - cut
        for got, want in zip(rest, full[cut:]):
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("name", batching.BATCHERS)
def test_resume_under_other_settings_goes_on_from_the_next_window(name):
    """Saved at a window's end, a state resumes under another window size (or shard count) with
    the next window: every document once over both runs. Saved inside a window, it is refused,
    not left to emit all-padding steps past the end of a plan made with other settings."""
    lengths = np.random.default_rng().integers(1, 64, size=90)
    old = _batcher(lengths, name, window=3)
    it = iter(old)
    steps, window_ends = [], []
    for _ in range(6):
        steps.append(next(it))
        if it._emitted == it._plan.num_steps:
            window_ends.append(len(steps))
    assert window_ends, "no window ended in six steps"
    it = iter(old)
    first = [next(it) for _ in range(window_ends[0])]
    state = json.loads(json.dumps(it.get_state()))
    for new in (_batcher(lengths, name, window=1), _batcher(lengths, name, window=3, shards=1)):
        resumed = iter(new)
        resumed.set_state(state)
        rest = list(resumed)
        assert rest and all(s["segment_ids"].any() for s in rest)
        assert _tokens_per_doc(first + rest) == {i + 1: n for i, n in enumerate(lengths)}
    it = iter(old)
    next(it)
    mid = json.loads(json.dumps(it.get_state()))
    assert mid["emitted"] < mid["window_steps"]
    with pytest.raises(batching.BatcherStateError, match=r"window: 3 -> 1.*halfway"):
        iter(_batcher(lengths, name, window=1)).set_state(mid)


def test_resume_inside_a_window_refuses_other_cost_numbers_or_other_documents():
    """SAB's plan depends on the cost model's numbers, not only on its kind: a state saved
    inside a window is refused under a model with other throughputs (re-planning the half-emitted
    window would repeat some documents and skip others), and under the same settings a window
    that reads back with other documents is refused too."""
    lengths = np.random.default_rng().integers(1, 64, size=90)
    it = iter(_batcher(lengths, "sab", window=3))
    next(it)
    mid = json.loads(json.dumps(it.get_state()))
    assert mid["emitted"] < mid["window_steps"]
    other = batching.make_batcher(
        "sab", grain.MapDataset.source([_doc(i + 1, int(n)) for i, n in enumerate(lengths)])
        .to_iter_dataset(), num_shards=2, micro_batches=2, rows_per_micro_batch=2, row_len=64,
        align=ALIGN, base_budget=2, window=3, seed=0,
        cost_model=AnalyticLatencyModel(COST.shape, attention_flops_per_s=1.0e13))
    with pytest.raises(batching.BatcherStateError, match=r"cost_model: 'AnalyticLatencyModel "
                                                         r"[0-9a-f]{12}' -> .*halfway"):
        iter(other).set_state(mid)
    shorter = np.where(np.arange(90) < 20, np.maximum(lengths // 4, 1), lengths)
    with pytest.raises(batching.BatcherStateError, match=r"reads back as .* documents differ"):
        iter(_batcher(shorter, "sab", window=3)).set_state(mid)
    # The same settings and documents resume where the saved run stood; so does a state that
    # names only the cost model's class (saved before its fingerprint was).
    want = next(it)["inputs"]
    for saved in (mid["settings"], dict(mid["settings"], cost_model="AnalyticLatencyModel")):
        resumed = iter(_batcher(lengths, "sab", window=3))
        resumed.set_state(dict(mid, settings=saved))
        np.testing.assert_array_equal(next(resumed)["inputs"], want)
    # A state from before the settings and the window's size were saved resumes too.
    oldest = {k: v for k, v in mid.items() if k not in ("settings", "window_docs", "window_steps")}
    resumed = iter(_batcher(lengths, "sab", window=3))
    resumed.set_state(oldest)
    np.testing.assert_array_equal(next(resumed)["inputs"], want)


def test_document_longer_than_a_row_is_an_error():
    with pytest.raises(ValueError, match="does not fit a row"):
        list(_batcher([10, 65, 3], "sab"))


def test_unknown_batcher_named():
    with pytest.raises(ValueError, match="'fifo'"):
        _batcher([10], "fifo")


def test_sab_balances_predicted_latency_better_than_random():
    # Long-tailed lengths, one row per micro-batch: the regime where balancing matters.
    rng = np.random.default_rng()
    lengths = np.clip(rng.lognormal(np.log(200), 0.8, size=600), 16, 1024).astype(np.int64)
    geometry = batching.StepGeometry(num_shards=8, micro_batches=1, rows_per_micro_batch=1,
                                     row_len=1024, align=ALIGN)
    cost = AnalyticLatencyModel(COST.shape, padding_is_free=True)
    imbalance = {name: batching.simulate_imbalance(name, lengths, geometry, cost, 4, window=4,
                                                   seed=int(rng.integers(1000))).mean()
                 for name in batching.BATCHERS}
    assert imbalance["sab"] < 1.10 < imbalance["random"]
    assert imbalance["sab"] <= imbalance["lbb"]
