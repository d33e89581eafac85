"""grain pipeline: deterministic documents, mixture, crops, step-batch iterator resume, shards."""

import json

import grain
import numpy as np
import pytest

from sparsebalance_jax.data import documents, packing, pipeline
from sparsebalance_jax.data.pipeline import DataSpec, document_dataset, train_iterator
from sparsebalance_jax.data.tokenizer import ASSISTANT_ID, EOS_ID, make_tokenizer

TOK = make_tokenizer("bytes")
SMALL = dict(length_distribution="chatqa2", length_scale=1 / 32, min_doc_len=16, max_doc_len=512)


def _docs(spec, seed, n, start=0, counter=None):
    ds = document_dataset(spec, seed, crop_counter=counter)
    return [ds[i] for i in range(start, start + n)]


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in documents.DOCUMENT_KEYS)


def _conversations(tmp_path, n, long_every=0):
    lines = []
    for i in range(n):
        body = ("lorem ipsum " * 60) if long_every and i % long_every == 0 else f"short {i}"
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"{body} Q{i}?"},
                                              {"role": "assistant", "content": f"answer {i}"}]}))
    path = tmp_path / "conv.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_documents_deterministic_given_seed(tmp_path):
    spec = DataSpec(text_weight=0.5, synthetic_weight=0.3, jsonl_weight=0.2,
                    jsonl_paths=(_conversations(tmp_path, 7),), synthetic_tasks=("needle",),
                    **SMALL)
    seed = int(np.random.default_rng().integers(2**31))
    a, b, c = _docs(spec, seed, 30), _docs(spec, seed, 30), _docs(spec, seed + 1, 30)
    assert all(_same(x, y) for x, y in zip(a, b))
    # Only jsonl documents (6 of 30: records drawn from 7) may coincide, never generated ones.
    assert sum(_same(x, y) for x, y in zip(a, c)) <= 6
    for d in a:
        assert documents.validate_document(d) <= spec.max_doc_len
    # Random access: index 17 read alone equals index 17 read in sequence.
    assert _same(_docs(spec, seed, 1, start=17)[0], a[17])


def test_each_generated_source_draws_its_own_lengths():
    # Document j of the text source and document j of the synthetic source come from streams
    # seeded apart (the source's tag is in the seed): their lengths are uncorrelated. Over 200
    # seeds the correlation of 64 such pairs stayed below 0.41; one stream for both reads ~0.98.
    spec = DataSpec(text_weight=0.5, synthetic_weight=0.5, synthetic_tasks=("needle",),
                    **{**SMALL, "length_scale": 1 / 8, "max_doc_len": 4096})
    seed = int(np.random.default_rng().integers(2**31))
    text = pipeline._GeneratedSource(spec, seed, pipeline._TEXT)
    synthetic = pipeline._GeneratedSource(spec, seed, pipeline._SYNTHETIC)
    a = [len(text[j]["inputs"]) for j in range(64)]
    b = [len(synthetic[j]["inputs"]) for j in range(64)]
    assert np.corrcoef(a, b)[0, 1] < 0.7


def test_mixture_follows_weights_and_jsonl_epochs_cover_every_record(tmp_path):
    spec = DataSpec(text_weight=0.75, jsonl_weight=0.25, jsonl_paths=(_conversations(tmp_path, 5),),
                    **SMALL)
    docs = _docs(spec, 3, 40)
    chats = [d for d in docs if np.any(d["loss_mask"] == 0)]  # text is trained on everywhere
    assert len(chats) == 10
    answers = [TOK.decode(d["targets"][d["loss_mask"] > 0]) for d in chats]
    assert sorted(answers[:5]) == [f"answer {i}" for i in range(5)]  # epoch 1: each once
    assert sorted(answers[5:]) == sorted(answers[:5]) and answers[5:] != answers[:5]


def test_long_records_cropped_explicitly_and_counted(tmp_path):
    spec = DataSpec(text_weight=0, jsonl_weight=1, jsonl_paths=(_conversations(tmp_path, 6, 3),),
                    **SMALL)
    counter = documents.CropCounter()
    docs = _docs(spec, 0, 6, counter=counter)
    assert counter.count == 2  # records 0 and 3 are ~740 tokens, max_doc_len is 512
    assert max(len(d["inputs"]) for d in docs) == 512
    for d in docs:  # the tail (the answer and its EOS) survives a crop
        assert d["targets"][-1] == EOS_ID and d["loss_mask"].sum() > 5


def test_synthetic_documents_train_on_the_answer_only():
    spec = DataSpec(text_weight=0, synthetic_weight=1, **{**SMALL, "max_doc_len": 1024})
    counter = documents.CropCounter()
    for d in _docs(spec, 11, 20, counter=counter):
        assert documents.validate_document(d) <= 1024 and d["targets"][-1] == EOS_ID
        trained = np.flatnonzero(d["loss_mask"])
        # One contiguous span at the end, right after the ASSISTANT id: answer + EOS.
        assert np.array_equal(trained, np.arange(trained[0], len(d["inputs"])))
        assert d["inputs"][trained[0]] == ASSISTANT_ID and 2 <= len(trained) < 80
    assert counter.count == 0
    with pytest.raises(ValueError, match="DataSpec.synthetic_tasks: task 'multikey'"):
        document_dataset(DataSpec(synthetic_weight=1, **SMALL), 0)


def test_spec_errors_name_the_field():
    with pytest.raises(ValueError, match="DataSpec.jsonl_paths"):
        DataSpec(jsonl_weight=1.0)
    with pytest.raises(ValueError, match="DataSpec.length_distribution"):
        DataSpec(length_distribution="zipf")
    with pytest.raises(ValueError, match="DataSpec.tokenizer"):
        DataSpec(tokenizer="gpt2")


# A private sequential batcher for the pipeline's own contract: R documents per micro-batch,
# one per row (always fits since max_doc_len <= row_len). The real batchers are tested in
# tests/test_batching*.py; one integration test below runs the real `lbb`.
class _SequentialBatcher(grain.IterDataset):
    def __init__(self, parent, *, num_shards, micro_batches, rows_per_micro_batch, row_len,
                 align, base_budget, **unused):
        super().__init__(parent)
        self.geometry = (num_shards, micro_batches, rows_per_micro_batch, row_len, align)
        self.base_budget = base_budget

    def __iter__(self):
        return _SequentialIterator(self._parent.__iter__(), self)


class _SequentialIterator(grain.DatasetIterator):
    def __init__(self, parent, ds):
        super().__init__(parent)
        self._ds = ds

    def __next__(self):
        S, M, R, T, align = self._ds.geometry
        bins = [packing.pack_rows([next(self._parent) for _ in range(R)], R, T, align)
                for _ in range(S * M)]
        out = {k: np.stack([b[k] for b in bins]).reshape(S, M, R, T) for k in packing.ROW_KEYS}
        out["budgets"] = np.full((S, M, R), self._ds.base_budget, np.int32)
        return out

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


@pytest.fixture
def sequential_batcher(monkeypatch):
    monkeypatch.setattr(pipeline, "make_batcher",
                        lambda name, parent, **kw: _SequentialBatcher(parent, **kw))


GEOMETRY = dict(num_shards=4, micro_batches=2, rows_per_micro_batch=2, row_len=512,
                block_size=32, base_budget=3)


def _steps(it, n):
    return [next(it) for _ in range(n)]


def _assert_steps_equal(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_iterator_shapes_and_state_round_trip(sequential_batcher):
    spec = DataSpec(**SMALL)
    seed = int(np.random.default_rng().integers(2**31))
    it = train_iterator(spec, seed, **GEOMETRY, cost_model=None)
    first = _steps(it, 2)
    step = first[0]
    assert step["inputs"].shape == (4, 2, 2, 512) and step["inputs"].dtype == np.int32
    assert step["loss_mask"].dtype == np.float32 and step["budgets"].shape == (4, 2, 2)
    state = it.get_state()
    expected = _steps(it, 3)
    resumed = train_iterator(spec, seed, **GEOMETRY, cost_model=None)
    resumed.set_state(state)
    _assert_steps_equal(_steps(resumed, 3), expected)
    again = train_iterator(spec, seed, **GEOMETRY, cost_model=None)
    _assert_steps_equal(_steps(again, 2), first)


def test_process_shards_are_slices_of_the_global_step(sequential_batcher):
    spec = DataSpec(**SMALL)
    full = _steps(train_iterator(spec, 5, **GEOMETRY, cost_model=None), 2)
    for shard_index in range(2):
        part = _steps(train_iterator(spec, 5, **GEOMETRY, cost_model=None,
                                     shard_index=shard_index, shard_count=2), 2)
        for f, p in zip(full, part):
            for k in f:
                np.testing.assert_array_equal(p[k], f[k][2 * shard_index:2 * shard_index + 2])
    with pytest.raises(ValueError, match="multiple of shard_count"):
        train_iterator(spec, 5, **GEOMETRY, cost_model=None, shard_count=3)
    with pytest.raises(ValueError, match="max_doc_len"):
        train_iterator(DataSpec(**{**SMALL, "max_doc_len": 1024}), 5, **GEOMETRY, cost_model=None)


def test_real_lbb_batcher_resumes_identically():
    from sparsebalance_jax.balance import latency

    shape = latency.LayerShape(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128,
                               block_size=32)
    kw = dict(GEOMETRY, batcher="lbb", window=2, cost_model=latency.AnalyticLatencyModel(shape))
    spec = DataSpec(**SMALL)
    it = train_iterator(spec, 1, **kw)
    _steps(it, 2)
    state = it.get_state()
    expected = _steps(it, 3)
    resumed = train_iterator(spec, 1, **kw)
    resumed.set_state(state)
    _assert_steps_equal(_steps(resumed, 3), expected)
    assert expected[0]["inputs"].shape == (4, 2, 2, 512)


def test_lookahead_is_checkpointed_as_if_nothing_were_held(sequential_batcher, tmp_path):
    """Lookahead: peek hands out the next step early; a checkpoint written while it is held
    (grain.checkpoint through orbax, as the loop writes them) restores to the state before it,
    so the resumed run's first step is the held one; with nothing held the file is the one
    grain writes for the bare iterator."""
    import orbax.checkpoint as ocp

    spec = DataSpec(**SMALL)
    seed = int(np.random.default_rng().integers(2**31))
    make = lambda: train_iterator(spec, seed, **GEOMETRY, cost_model=None)
    want = _steps(make(), 4)
    it = pipeline.Lookahead(make())
    _assert_steps_equal([next(it)], want[:1])
    peeked = it.peek()
    assert it.peek() is peeked  # held until taken
    _assert_steps_equal([peeked], want[1:2])
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
        _assert_steps_equal([next(it), next(it)], want[1:3])  # the held one, then on
        resumed = pipeline.Lookahead(make())
        manager.restore(1, args=ocp.args.Composite(
            data=grain.checkpoint.CheckpointRestore(resumed)))
    _assert_steps_equal(_steps(resumed, 3), want[1:4])
    # Nothing held: the same bytes as grain's own checkpoint of the bare iterator.
    bare, wrapped = make(), pipeline.Lookahead(make())
    _steps(bare, 1), _steps(wrapped, 1)
    for name, item in (("bare", bare), ("wrapped", wrapped)):
        (tmp_path / name).mkdir()
        grain.checkpoint.CheckpointHandler().save(tmp_path / name,
                                                  args=grain.checkpoint.CheckpointSave(item))
    files = [sorted((tmp_path / name).iterdir()) for name in ("bare", "wrapped")]
    assert [f.read_bytes() for f in files[0]] == [f.read_bytes() for f in files[1]]


def test_lookahead_keeps_an_error_for_the_next_that_would_have_raised_it():
    """A peek whose read fails returns None and holds the error; the next `next` raises it,
    and the state is still the one before the failed read."""
    def element(i):
        if i == 1:
            raise ValueError("document 1 does not fit a row")
        return i

    it = pipeline.Lookahead(iter(grain.MapDataset.range(3).map(element).to_iter_dataset()))
    assert next(it) == 0
    before = it.get_state()
    assert it.peek() is None
    assert it.get_state() == before
    with pytest.raises(ValueError, match="document 1 does not fit"):
        next(it)
    ends = pipeline.Lookahead(iter(grain.MapDataset.range(1).to_iter_dataset()))
    assert next(ends) == 0 and ends.peek() is None
    with pytest.raises(StopIteration):
        next(ends)


def test_jsonl_order_follows_the_seed(tmp_path):
    """The jsonl records' per-epoch shuffle is seeded by the run's seed: other seeds, other
    orders (8 records: two seeds agree with probability 1/8!)."""
    spec = DataSpec(text_weight=0, jsonl_weight=1, jsonl_paths=(_conversations(tmp_path, 8),),
                    **SMALL)
    seed = int(np.random.default_rng().integers(2**31))
    # Two epochs of each seed's order.
    epochs = {s: [tuple(TOK.decode(d["targets"][d["loss_mask"] > 0]) for d in docs)
                  for docs in (lambda ds: (ds[:8], ds[8:]))(_docs(spec, s, 16))]
              for s in (seed, seed + 1, seed + 2)}
    orders = {e[0] for e in epochs.values()}
    assert all(sorted(o) == sorted(f"answer {i}" for i in range(8)) for o in orders)
    assert len(orders) > 1, orders
    # Nor is seed s + 1's stream seed s's one epoch on (a shuffle seeded seed + epoch would be).
    for s in (seed, seed + 1):
        assert epochs[s][1] != epochs[s + 1][0], (s, epochs[s][1])
