"""DST tuner decisions on a synthetic latency table: anchors, bound p, coverage floor, buckets."""

import json
import math

import numpy as np
import pytest

from sparsebalance_jax.balance import tuner

BASE = 20
BUCKETS = (8, 16, 24, 32)


def _table(load_S):
    """Synthetic latency table: unit s at budget k takes load_s * (1 + k / 10) seconds."""
    latency_SK = np.asarray(load_S)[:, None] * (1.0 + np.arange(0, BUCKETS[-1] + 1) / 10.0)
    return latency_SK, (lambda s, k: float(latency_SK[s, k]))


def _config(**kw):
    # Rules 1-4 are tested with raises free to cross buckets; rule 5 has its own test.
    return tuner.TunerConfig(**{"anchor": "mean", "p": 0.3, "coverage_floor": 0.0,
                                "buckets": BUCKETS, "raise_within_bucket": False, **kw})


def test_mean_anchor_moves_stragglers_down_and_light_units_up_without_passing_it():
    load = np.array([1.0, 1.0, 1.2, 0.8])
    table, fn = _table(load)
    budgets = tuner.decide(table[:, BASE], BASE, None, fn, _config())
    anchor = table[:, BASE].mean()
    assert budgets[2] < BASE and budgets[3] > BASE and budgets[0] == budgets[1] == BASE
    lo = BASE - math.ceil(0.3 * BASE)
    for s, k in enumerate(budgets):
        if k > BASE:  # a light unit never passes the anchor and stops at the last budget under it
            assert table[s, k] <= anchor + 1e-12
            assert k == BASE + 6 or table[s, k + 1] > anchor
        if k < BASE:  # a straggler lands on the budget whose latency is closest to the anchor
            gaps = np.abs(table[s, lo:BASE + 1] - anchor)
            assert k == lo + int(np.argmin(gaps))


def test_straggler_barely_above_the_anchor_keeps_its_budget():
    # Unit 1 stands 0.1% above the mean: one block less would put it 9% below the anchor.
    load = np.array([1.0, 1.002, 0.998])
    table, fn = _table(load)
    budgets = tuner.decide(table[:, BASE], BASE, None, fn, _config())
    assert budgets[1] == BASE


def test_dead_band_keeps_units_whose_gap_is_within_the_prediction_error():
    # Units 0 / 1 stand 4% above / below the mean, units 2 / 3 stand 12% above / below.
    load = np.array([1.04, 0.96, 1.12, 0.88])
    table, fn = _table(load)
    anchor = table[:, BASE].mean()
    free = tuner.decide(table[:, BASE], BASE, None, fn, _config())
    assert np.all(free != BASE)
    banded = tuner.decide(table[:, BASE], BASE, None, fn, _config(dead_band=0.05))
    assert banded[0] == banded[1] == BASE and banded[2] < BASE and banded[3] > BASE
    assert table[3, banded[3]] <= anchor * 0.95 + 1e-12 < table[3, banded[3] + 1]
    # A measured error wider than the static band widens it for that unit only.
    measured = tuner.decide(table[:, BASE], BASE, None, fn, _config(dead_band=0.05),
                            error_S=np.array([0.0, 0.0, 0.15, 0.0]))
    assert measured[2] == BASE and measured[3] == banded[3]
    with pytest.raises(ValueError, match="dead_band"):
        _config(dead_band=1.0)


def test_raises_stay_within_the_base_budgets_bucket():
    # Base 20 sits in bucket 24 of (8, 16, 24, 32): p = 0.3 would allow 26, the bucket stops at
    # 24, so the step keeps the k_max the base needs; lowering is unaffected.
    load = np.array([1.3, 1.0, 0.6, 0.5])
    table, fn = _table(load)
    free = tuner.decide(table[:, BASE], BASE, None, fn, _config())
    within = tuner.decide(table[:, BASE], BASE, None, fn, _config(raise_within_bucket=True))
    assert free.max() == BASE + 6 and tuner.bucket_for(free, BUCKETS) == 32
    assert within.max() == 24 and tuner.bucket_for(within, BUCKETS) == 24
    assert within[0] == free[0] < BASE  # the straggler is lowered alike
    # A base at the top of its bucket cannot rise at all.
    top = tuner.decide(table[:, 16], 16, None, fn, _config(raise_within_bucket=True))
    assert top.max() == 16 and top.min() < 16


def test_tuner_band_follows_its_measured_error():
    load = np.array([1.1, 0.9])
    table, fn = _table(load)
    t = tuner.Tuner(_config(), num_units=2, ema_decay=0.5)
    assert np.all(t.decide(BASE, fn).budgets_S != BASE)
    predicted = table[:, BASE]
    t.observe(predicted, predicted)  # first: the ratio is set, no error yet
    t.observe(predicted * 1.2, predicted)  # the corrected prediction missed by 20%
    np.testing.assert_allclose(t.ema.error_S, [0.2, 0.2])
    assert np.all(t.decide(BASE, fn).budgets_S == BASE)


@pytest.mark.parametrize("anchor", ["min", "max"])
def test_min_anchor_only_lowers_and_max_anchor_only_raises(anchor):
    load = np.random.default_rng().uniform(0.5, 2.0, size=8)
    table, fn = _table(load)
    budgets = tuner.decide(table[:, BASE], BASE, None, fn, _config(anchor=anchor))
    if anchor == "min":
        assert np.all(budgets <= BASE) and budgets[np.argmin(load)] == BASE
    else:
        assert np.all(budgets >= BASE) and budgets[np.argmax(load)] == BASE
    assert np.any(budgets != BASE)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.3])
def test_change_bounded_by_p(p):
    rng = np.random.default_rng()
    for _ in range(20):
        load = rng.uniform(0.1, 10.0, size=8)  # far apart: every unit wants the extremes
        table, fn = _table(load)
        budgets = tuner.decide(table[:, BASE], BASE, None, fn, _config(p=p))
        step = math.ceil(p * BASE - 1e-9)
        assert np.all(np.abs(budgets - BASE) <= step)
        assert budgets.min() == BASE - step and budgets.max() == BASE + step


def test_small_base_can_still_move_one_block():
    table, fn = _table(np.array([1.0, 2.0]))
    budgets = tuner.decide(table[:, 3], 3, None, fn, _config(p=0.1))
    np.testing.assert_array_equal(budgets, [4, 2])


def test_coverage_floor_stops_decreases_only():
    load = np.array([3.0, 1.0, 1.0, 1.0])  # unit 0 is a straggler that wants the lowest budget
    table, fn = _table(load)
    # Coverage rises with budget; unit 0 reaches 0.9 only at budget 18.
    coverage_SK = np.tile(np.linspace(0.0, 1.0, BUCKETS[-1]), (4, 1))
    coverage_SK[0] = np.where(np.arange(1, BUCKETS[-1] + 1) >= 18, 0.95, 0.5)
    free = tuner.decide(table[:, BASE], BASE, None, fn, _config(coverage_floor=0.9))
    floored = tuner.decide(table[:, BASE], BASE, coverage_SK, fn, _config(coverage_floor=0.9))
    assert free[0] == 14 and floored[0] == 18
    np.testing.assert_array_equal(free[1:], floored[1:])  # light units go up regardless
    # The callable form gives the same decision.
    by_fn = tuner.decide(table[:, BASE], BASE, lambda s, k: coverage_SK[s, k - 1], fn,
                         _config(coverage_floor=0.9))
    np.testing.assert_array_equal(by_fn, floored)
    # A base that already misses the floor: the unit stays at the base.
    coverage_SK[0] = 0.1
    stuck = tuner.decide(table[:, BASE], BASE, coverage_SK, fn, _config(coverage_floor=0.9))
    assert stuck[0] == BASE


def test_bucket_is_smallest_configured_k_max_at_or_above_the_largest_budget():
    assert tuner.bucket_for(np.array([3, 9, 16]), BUCKETS) == 16
    assert tuner.bucket_for(np.array([17]), BUCKETS) == 24
    assert tuner.bucket_for(np.array([1]), BUCKETS) == 8
    with pytest.raises(ValueError, match="largest bucket 32"):
        tuner.bucket_for(np.array([33]), BUCKETS)


def test_budgets_clipped_to_largest_bucket():
    load = np.array([0.1, 5.0])
    table, fn = _table(load)
    budgets = tuner.decide(table[:, 30], 30, None, fn, _config())
    assert budgets[0] == BUCKETS[-1] and budgets[1] == 21


def test_disabled_returns_base_and_config_validates():
    table, fn = _table(np.array([1.0, 3.0]))
    assert np.all(tuner.decide(table[:, BASE], BASE, None, fn, _config(enabled=False)) == BASE)
    with pytest.raises(ValueError, match="p=0.5"):
        tuner.TunerConfig(p=0.5)
    with pytest.raises(ValueError, match="anchor"):
        tuner.TunerConfig(anchor="median")
    with pytest.raises(ValueError, match="buckets"):
        tuner.TunerConfig(buckets=(16, 8))


def test_tuner_uses_ema_correction_and_state_round_trips():
    load = np.array([1.0, 1.0])
    _, fn = _table(load)
    t = tuner.Tuner(_config(), num_units=2, ema_decay=0.5, history=4)
    first = t.decide(BASE, fn)
    assert np.all(first.budgets_S == BASE)  # equal predictions: nothing to move
    # Unit 1 measured twice as slow as predicted: after correction it is the straggler.
    t.observe(np.array([3.0, 6.0]), np.array([3.0, 3.0]))
    second = t.decide(BASE, fn)
    assert second.budgets_S[1] < BASE < second.budgets_S[0]
    assert second.bucket == tuner.bucket_for(second.budgets_S, BUCKETS)
    assert second.host_seconds > 0
    restored = tuner.Tuner(_config(), num_units=2, ema_decay=0.5, history=4)
    restored.load_state_dict(json.loads(json.dumps(t.state_dict())))
    np.testing.assert_array_equal(restored.decide(BASE, fn).budgets_S, t.decide(BASE, fn).budgets_S)
    assert restored.step == t.step


def test_table_priced_only_within_the_bounds_gives_the_same_decisions():
    from sparsebalance_jax.balance.latency import AnalyticLatencyModel, LayerShape

    model = AnalyticLatencyModel(LayerShape(64, 4, 2, 16, 128, 16))
    rng = np.random.default_rng()
    config = _config(buckets=(16, 24))
    bounds = tuner.budget_bounds(16, config.p, config.k_max)
    for _ in range(20):
        doc_lengths_SMD = rng.integers(0, 400, size=(8, 2, 6))
        full = tuner.shard_latency_table(doc_lengths_SMD, model, 24, padded_tokens=4096)
        part = tuner.shard_latency_table(doc_lengths_SMD, model, 24, padded_tokens=4096,
                                         budget_range=bounds)
        lo, hi = bounds
        np.testing.assert_array_equal(part[:, lo:hi + 1], full[:, lo:hi + 1])
        assert np.isnan(part[:, :lo]).all() and np.isnan(part[:, hi + 1:]).all()
        want = tuner.decide(full[:, 16], 16, None, lambda s, k: full[s, k], config)
        got = tuner.decide(part[:, 16], 16, None, lambda s, k: part[s, k], config)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="budget_range"):
        tuner.shard_latency_table(doc_lengths_SMD, model, 24, budget_range=(0, 30))


def test_shard_latency_table_sums_micro_batches():
    from sparsebalance_jax.balance.latency import AnalyticLatencyModel, LayerShape

    model = AnalyticLatencyModel(LayerShape(64, 4, 2, 16, 128, 16))
    doc_lengths_SMD = np.random.default_rng().integers(0, 200, size=(3, 2, 4))
    seconds_SK = tuner.shard_latency_table(doc_lengths_SMD, model, 5, padded_tokens=1024)
    for s in range(3):
        for k in (1, 5):
            want = sum(model.predict(doc_lengths_SMD[s, m], k, padded_tokens=1024)
                       for m in range(2))
            assert seconds_SK[s, k] == pytest.approx(want, rel=1e-12)
