"""Batchers: exactly-once over an epoch, determinism, resume, capacity errors, balance."""

import json

import grain
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsebalance_jax.balance.latency import AnalyticLatencyModel, LatencyModel, LayerShape
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
        # doc_ids count from the stream's start across the resume too.
        ids = np.concatenate([s["doc_ids"].ravel() for s in first + rest])
        assert np.array_equal(np.sort(ids[ids >= 0]), np.arange(len(lengths)))
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


class _PerToken(LatencyModel):
    """A test double: a document costs `seconds_per_token` a token plus `extra` of its length
    (a dict), padding `pad` a token, no fixed part; budget-blind."""

    block_size = ALIGN

    def __init__(self, pad: float = 0.0, extra: dict | None = None, seconds_per_token=1.0):
        self.pad_seconds_per_token, self.extra, self.per = pad, extra or {}, seconds_per_token

    def doc_seconds(self, lengths_N, budget):
        lengths_N = np.asarray(lengths_N)
        extra = np.array([self.extra.get(int(n), 0.0) for n in lengths_N.ravel()])
        return lengths_N * self.per + extra.reshape(lengths_N.shape)

    def fingerprint(self) -> str:
        return "per-token"


def _bin_costs(plan, lengths, geometry, cost_N):
    """Cost float64 [steps, S, M] of every bin of a plan: its documents' costs summed."""
    S, M = geometry.num_shards, geometry.micro_batches
    cost_TSM = np.zeros((plan.num_steps, S, M))
    np.add.at(cost_TSM, (plan.step_N, plan.shard_N, plan.micro_N), cost_N)
    return cost_TSM


def test_sab_shards_get_bins_by_lpt_on_the_net_predicted_cost():
    """SAB's steps: bins sorted by predicted cost (net of the padding a document replaces) and
    cut into steps; inside a step, the most expensive bin first to the cheapest shard with a
    free micro-batch slot. Written out here per step, with M > 1 (with M = 1 every order
    gives each shard one bin), on an attention-heavy model whose cost is far from the token
    count, with padding priced."""
    rng = np.random.default_rng()
    geometry = batching.StepGeometry(num_shards=4, micro_batches=4, rows_per_micro_batch=1,
                                     row_len=1024, align=ALIGN)
    cost = AnalyticLatencyModel(COST.shape, attention_flops_per_s=2e11)
    S, M = 4, 4
    for _ in range(6):
        lengths = np.clip(rng.lognormal(np.log(200), 0.9, size=150), 16, 1024).astype(np.int64)
        plan = batching.plan_window("sab", lengths, geometry, cost, 8,
                                    np.random.default_rng(int(rng.integers(2**31))))
        cost_N = cost.doc_seconds(lengths, 8) - lengths * cost.pad_seconds_per_token
        cost_TSM = _bin_costs(plan, lengths, geometry, cost_N)
        for t in range(plan.num_steps - 1):  # similar costs share a step: no interleaving
            a, b = cost_TSM[t], cost_TSM[t + 1]
            assert a.min() >= b.max() * (1 - 1e-9) or b.min() >= a.max() * (1 - 1e-9)
        for t in range(plan.num_steps):
            load, used = np.zeros(S), np.zeros(S, np.int64)
            for c in sorted(cost_TSM[t].ravel(), reverse=True):
                free = np.flatnonzero(used < M)
                s = free[np.argmin(load[free])]
                load[s] += c
                used[s] += 1
            np.testing.assert_allclose(np.sort(cost_TSM[t].sum(axis=1)), np.sort(load),
                                       rtol=1e-9, err_msg=f"step {t}")


def test_sab_local_search_swaps_out_of_the_costliest_bin():
    # Costs 3, 3, 2, 2, 2 on two shards: LPT alone ends 7 / 5 ({3, 2, 2} / {3, 2}); swapping
    # a 3 out of the costliest bin for a 2 balances them, 6 / 6.
    geometry = batching.StepGeometry(num_shards=2, micro_batches=1, rows_per_micro_batch=1,
                                     row_len=256, align=ALIGN)
    lengths = np.random.default_rng().permutation([48, 48, 32, 32, 32])
    model = _PerToken()
    plan = batching.plan_window("sab", lengths, geometry, model, 1, np.random.default_rng())
    seconds_TS = batching.predicted_step_seconds(plan, lengths, geometry, model, 1)
    np.testing.assert_array_equal(seconds_TS, [[96.0, 96.0]])


def test_sab_prices_a_document_net_of_the_padding_it_replaces():
    """Every bin pays its free tokens as padding, so what a document adds to its bin is its
    cost less that of the padding it displaces. Here the 64-token document costs just what its
    padding would (it adds nothing) and each 16-token one adds 10: the best split is 20 / 10;
    balancing the documents' gross costs (64 against 26 each) gives 0 / 30."""
    geometry = batching.StepGeometry(num_shards=2, micro_batches=1, rows_per_micro_batch=1,
                                     row_len=256, align=ALIGN)
    model = _PerToken(pad=1.0, extra={16: 10.0})
    lengths = np.random.default_rng().permutation([64, 16, 16, 16])
    plan = batching.plan_window("sab", lengths, geometry, model, 1, np.random.default_rng())
    seconds_TS = batching.predicted_step_seconds(plan, lengths, geometry, model, 1)
    np.testing.assert_array_equal(np.sort(seconds_TS[0]), [256.0 + 10, 256.0 + 20])


def test_lbb_puts_the_longest_document_first_into_the_bin_with_fewest_tokens():
    """The baseline as the module docstring states it: documents longest first, each to the bin
    with the fewest tokens that can take it (lowest index on ties; equal lengths are
    interchangeable, so the bins' length multisets are what is compared)."""
    rng = np.random.default_rng()
    geometry = batching.StepGeometry(num_shards=2, micro_batches=2, rows_per_micro_batch=1,
                                     row_len=512, align=ALIGN)
    cost = AnalyticLatencyModel(COST.shape, attention_flops_per_s=2e11)
    for _ in range(8):
        lengths = rng.integers(1, 300, size=int(rng.integers(30, 80)))
        plan = batching.plan_window("lbb", lengths, geometry, cost, 4,
                                    np.random.default_rng(int(rng.integers(2**31))))
        num_bins = plan.num_steps * geometry.bins_per_step
        aligned = -(-lengths // ALIGN) * ALIGN
        tokens, want = np.zeros(num_bins, np.int64), [[] for _ in range(num_bins)]
        for d in np.argsort(-lengths, kind="stable"):
            b = next(b for b in np.argsort(tokens, kind="stable")
                     if tokens[b] + aligned[d] <= geometry.bin_tokens)
            tokens[b] += aligned[d]
            want[b].append(int(lengths[d]))
        got = {}
        for d, key in enumerate(zip(plan.step_N, plan.shard_N, plan.micro_N)):
            got.setdefault(key, []).append(int(lengths[d]))
        got_bins = sorted(tuple(sorted(v)) for v in got.values())
        assert got_bins == sorted(tuple(sorted(v)) for v in want if v)


def test_a_document_that_exactly_fills_the_window_joins_it():
    # fill 1, one bin of 64 tokens per step, window 1: 32 + 32 fills the target exactly.
    geometry = batching.StepGeometry(num_shards=1, micro_batches=1, rows_per_micro_batch=1,
                                     row_len=64, align=ALIGN)
    windows = batching.split_windows(np.array([20, 32, 16, 64]), geometry, 1, fill=1.0)
    assert [w.tolist() for w in windows] == [[0, 1], [2], [3]]


@pytest.mark.parametrize("name", batching.BATCHERS)
def test_a_window_plans_ceil_of_its_tokens_over_a_steps_capacity(name):
    """n_steps = ceil(tokens / (S*M*R*T * fill)): documents of one block each always fit, so
    no step is added, and none taken away (fill's slack is kept)."""
    geometry = batching.StepGeometry(num_shards=2, micro_batches=2, rows_per_micro_batch=2,
                                     row_len=64, align=ALIGN)
    rng = np.random.default_rng()
    for n in rng.integers(1, 120, size=10):
        lengths = rng.integers(1, ALIGN + 1, size=int(n))
        plan = batching.plan_window(name, lengths, geometry, COST, 2, rng)
        assert plan.num_steps == int(np.ceil(ALIGN * n / (4 * 128 * batching.DEFAULT_FILL))), n


def test_predicted_seconds_price_every_bin_with_its_padding():
    """A step's predicted_seconds [S, M] is the cost model's micro-batch prediction, padding
    included (module docstring); predicted_step_seconds sums them per shard."""
    rng = np.random.default_rng()
    lengths = rng.integers(1, 64, size=90)
    ds = _batcher(lengths, "sab", window=3)
    for step in ds:
        want = COST.predict_batch(step["doc_lengths"].reshape(4, -1), 2, padded_tokens=128)
        np.testing.assert_allclose(step["predicted_seconds"].ravel(), want, rtol=1e-6)
    geometry = batching.StepGeometry(num_shards=2, micro_batches=2, rows_per_micro_batch=2,
                                     row_len=64, align=ALIGN)
    plan = batching.plan_window("lbb", lengths, geometry, COST, 2, rng)
    got_TS = batching.predicted_step_seconds(plan, lengths, geometry, COST, 2)
    for t in range(plan.num_steps):
        for s in range(2):
            want = sum(COST.predict(lengths[(plan.step_N == t) & (plan.shard_N == s)
                                            & (plan.micro_N == m)], 2, padded_tokens=128)
                       for m in range(2))
            assert got_TS[t, s] == pytest.approx(want, rel=1e-12)


def test_sab_never_overfills_a_bin_even_when_cost_ignores_length():
    """SAB's moves and swaps keep both bins within capacity: with costs unrelated to length
    (a cheaper document may be longer) a swap must check the costly bin too."""
    rng = np.random.default_rng()
    geometry = batching.StepGeometry(num_shards=2, micro_batches=2, rows_per_micro_batch=1,
                                     row_len=64, align=ALIGN)
    for _ in range(150):
        model = _PerToken(extra={n: float(rng.uniform(0, 100)) for n in range(1, 65)},
                          seconds_per_token=0.0)
        lengths = rng.integers(1, 65, size=int(rng.integers(4, 30)))
        plan = batching.plan_window("sab", lengths, geometry, model, 1, rng)
        tokens_TSM = np.zeros((plan.num_steps, 2, 2))
        np.add.at(tokens_TSM, (plan.step_N, plan.shard_N, plan.micro_N),
                  -(-lengths // ALIGN) * ALIGN)
        assert tokens_TSM.max() <= geometry.bin_tokens, lengths.tolist()


def test_random_draws_bins_yet_fills_steps_as_lbb():
    """random: each document, longest first, to a bin drawn at random among those that fit.
    Its steps are as full as lbb's (dealt in a random order instead, short documents spread
    over every bin and late long ones fit none: the window took ~3x the steps), yet where a
    document goes follows the rng, not the bins' loads."""
    rng = np.random.default_rng()
    geometry = batching.StepGeometry(num_shards=4, micro_batches=2, rows_per_micro_batch=1,
                                     row_len=1024, align=ALIGN)
    lengths = np.minimum((rng.pareto(1.2, size=600) + 1) * 40, 1024).astype(np.int64)
    steps = {"random": 0, "lbb": 0}
    for w, idx in enumerate(batching.split_windows(lengths, geometry, window=4)):
        for method in steps:
            plan = batching.plan_window(method, lengths[idx], geometry, COST, 2,
                                        np.random.default_rng([w]))
            steps[method] += plan.num_steps
    assert steps["random"] <= 1.1 * steps["lbb"], steps
    # Which documents share a bin (what the steps' random arrangement cannot change): with
    # distinct lengths lbb's greedy groups them one way whatever the rng, random by its draws.
    distinct = rng.choice(np.arange(1, 1025), size=60, replace=False)

    def groupings(method):
        out = set()
        for seed in range(3):
            plan = batching.plan_window(method, distinct, geometry, COST, 2,
                                        np.random.default_rng([seed]))
            bins = {}
            for d, place in enumerate(zip(plan.step_N, plan.shard_N, plan.micro_N)):
                bins.setdefault(place, set()).add(d)
            out.add(frozenset(map(frozenset, bins.values())))
        return out

    assert len(groupings("lbb")) == 1 and len(groupings("random")) > 1


def test_local_search_never_raises_the_costliest_bin():
    """A cost model may price a short document below the padding its tokens replace (a
    negative net cost): moving it out of the costliest bin would raise that bin, not lower it."""
    geometry = batching.StepGeometry(2, 1, 1, 64, 16)
    lengths = np.array([32, 16, 16])
    bins = batching._Bins(2, geometry, lengths.copy(), lengths, np.array([10.0, -1.0, 5.0]))
    for b, d in ((0, 0), (0, 1), (1, 2)):
        bins.put(b, d)
    for _ in range(3):  # each round makes one move or swap, or stops
        batching._improve(bins, max_rounds=1)
        assert bins.cost_B.max() == 9.0 and sorted(map(sorted, bins.docs)) == [[0, 1], [2]]


def test_a_batcher_that_places_nothing_is_an_error_not_a_hang(monkeypatch):
    """plan_window adds steps until the documents fit; a bin per document always does, so past
    that it raises instead of looping for ever (a bin that refuses everything here)."""
    geometry = batching.StepGeometry(num_shards=2, micro_batches=1, rows_per_micro_batch=1,
                                     row_len=64, align=ALIGN)
    monkeypatch.setattr(batching._Bins, "fits", lambda self, b, add, remove=(): False)
    with pytest.raises(RuntimeError, match="5 documents in no plan of up to 3 steps"):
        batching.plan_window("sab", np.full(5, 16), geometry, COST, 1, np.random.default_rng())
