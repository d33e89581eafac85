"""DST tuner decisions on a synthetic latency table: anchors, bound p, coverage floor, buckets;
and the whole per-step decision (pricing + rule) against a per-unit, per-budget reference."""

import dataclasses
import json
import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparsebalance_jax.balance import latency, tuner

H200_TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "latency_tables",
                          "NVIDIA_H200__d896_h14_kv2_hd64_mlp4864_blk512_moba_mosaic.json")

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
    lo = 14  # rule 1: 20 - ceil(0.3 * 20)
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


def test_exact_ties_rise_onto_the_anchor_and_keep_the_larger_budget():
    # Binary-exact latencies, base 4, mean anchor exactly 6. Unit 0 may rise onto the anchor
    # (budget 5) but not past it; unit 1's budgets 3 and 2 lie equally far from the anchor
    # (7 and 5): the larger wins.
    latency_SK = np.array([[0, 1, 2, 3, 4, 6, 7, 8, 9],
                           [0, 1, 5, 7, 8, 9, 10, 11, 12]], dtype=np.float64)
    config = tuner.TunerConfig(anchor="mean", p=0.3, coverage_floor=0.0, buckets=(8,))
    budgets = tuner.decide(latency_SK[:, 4], 4, None, lambda s, k: latency_SK[s, k], config)
    np.testing.assert_array_equal(budgets, [5, 3])
    d = tuner.Tuner(config, num_units=2).decide(4, latency_SK)
    np.testing.assert_array_equal(d.budgets_S, [5, 3])
    assert d.anchor_seconds == 6.0 and list(d.predicted_after_S) == [6.0, 7.0]
    # Mean anchor 8, dead band 0.25: units exactly on the band's edges (6 and 10) stay.
    latency_SK = np.array([[0, 1, 2, 5, 6, 6, 7, 8, 9],
                           [0, 1, 5, 9, 10, 11, 12, 13, 14]], dtype=np.float64)
    banded = dataclasses.replace(config, dead_band=0.25)
    budgets = tuner.decide(latency_SK[:, 4], 4, None, lambda s, k: latency_SK[s, k], banded)
    np.testing.assert_array_equal(budgets, [4, 4])


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
    table, _ = _table(load)
    t = tuner.Tuner(_config(), num_units=2, ema_decay=0.5)
    assert np.all(t.decide(BASE, table).budgets_S != BASE)
    predicted = table[:, BASE]
    t.observe(predicted, predicted)  # first: the ratio is set, no error yet
    t.observe(predicted * 1.2, predicted)  # the corrected prediction missed by 20%
    np.testing.assert_allclose(t.ema.error_S, [0.2, 0.2])
    assert np.all(t.decide(BASE, table).budgets_S == BASE)


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


def test_budget_bounds_are_p_times_base_rounded_up_to_whole_blocks():
    # The documented values (module docstring, rule 1), case by case.
    assert tuner.budget_bounds(20, 0.1, 32) == (18, 22)
    assert tuner.budget_bounds(20, 0.2, 32) == (16, 24)
    assert tuner.budget_bounds(20, 0.3, 32) == (14, 26)  # 0.3 * 20 is 6.000000000000001: 6
    assert tuner.budget_bounds(16, 0.3, 24) == (11, 21)  # 4.8 rounds up to 5
    assert tuner.budget_bounds(3, 0.3, 8) == (2, 4)  # 0.9: a small base still moves one block
    assert tuner.budget_bounds(1, 0.1, 8) == (1, 2)  # never below budget 1
    assert tuner.budget_bounds(30, 0.3, 32) == (21, 32)  # never above the largest bucket


@pytest.mark.parametrize("p, step", [(0.1, 2), (0.2, 4), (0.3, 6)])
def test_change_bounded_by_p(p, step):
    rng = np.random.default_rng()
    for _ in range(20):
        # One unit far above the rest and one far below: whatever the others draw (<= 1.0),
        # the mean anchor is at least 2.5x under the heavy unit's latency at any allowed
        # budget and over 9x above the light unit's, so those two go to the bounds.
        load = rng.permutation(np.concatenate([[10.0, 0.1], rng.uniform(0.1, 1.0, size=6)]))
        table, fn = _table(load)
        budgets = tuner.decide(table[:, BASE], BASE, None, fn, _config(p=p))
        assert np.all(np.abs(budgets - BASE) <= step)
        assert budgets.min() == BASE - step and budgets.max() == BASE + step


def test_light_unit_keeps_the_smaller_of_equally_fast_budgets():
    # Unit 1's documents have 4 blocks, fewer than the base 16: every budget from 16 up costs
    # the same. Raising it buys nothing and, with raises free to cross buckets, would move the
    # step into bucket 24.
    model = latency.AnalyticLatencyModel(latency.LayerShape(896, 14, 2, 64, 4864, 256))
    config = tuner.TunerConfig(anchor="mean", p=0.3, coverage_floor=0.0, buckets=(16, 24),
                               raise_within_bucket=False)
    doc_lengths_SMD = np.zeros((2, 1, 64), np.int64)
    doc_lengths_SMD[0, 0, 0] = 16384  # one long document: the straggler
    doc_lengths_SMD[1, 0, :16] = 1024  # 16 documents of 4 blocks
    seconds_SK = tuner.shard_latency_table(doc_lengths_SMD, model, 24, padded_tokens=16384)
    assert np.all(seconds_SK[1, 16:22] == seconds_SK[1, 16])
    d = tuner.Tuner(config, 2).decide(16, seconds_SK)
    assert d.budgets_S[0] < 16 and d.budgets_S[1] == 16 and d.bucket == 16
    # Base 4 may rise to 6; the mean anchor is 7. Flat from 4: unit 0 stays. Rising to 5, then
    # flat: it takes 5, not 6.
    config = tuner.TunerConfig(anchor="mean", p=0.3, coverage_floor=0.0, buckets=(8,))
    for row, want in (([0, 1, 2, 3, 4, 4, 4, 9, 9], 4), ([0, 1, 2, 3, 4, 5, 5, 9, 9], 5)):
        latency_SK = np.array([row, [0, 1, 8, 9, 10, 11, 12, 13, 14]], dtype=np.float64)
        budgets = tuner.decide(latency_SK[:, 4], 4, None, lambda s, k: latency_SK[s, k], config)
        np.testing.assert_array_equal(budgets, [want, 2])


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
    table, _ = _table(load)
    t = tuner.Tuner(_config(), num_units=2, ema_decay=0.5, history=4)
    first = t.decide(BASE, table)
    assert np.all(first.budgets_S == BASE)  # equal predictions: nothing to move
    # Unit 1 measured twice as slow as predicted: after correction it is the straggler.
    t.observe(np.array([3.0, 6.0]), np.array([3.0, 3.0]))
    second = t.decide(BASE, table)
    assert second.budgets_S[1] < BASE < second.budgets_S[0]
    assert second.bucket == tuner.bucket_for(second.budgets_S, BUCKETS)
    # The decision's time holds the coverage probes it asks for (the train loop's overhead).
    probe_seconds = 0.05

    def slow_coverage(unit, budget):
        time.sleep(probe_seconds)
        return 1.0

    start = time.perf_counter()
    probed = t.decide(BASE, table, slow_coverage)
    wall = time.perf_counter() - start
    assert probed.budgets_S[1] < BASE  # lowering asks for coverage: at least one probe
    assert probe_seconds <= probed.host_seconds <= wall
    restored = tuner.Tuner(_config(), num_units=2, ema_decay=0.5, history=4)
    restored.load_state_dict(json.loads(json.dumps(t.state_dict())))
    np.testing.assert_array_equal(restored.decide(BASE, table).budgets_S,
                                  t.decide(BASE, table).budgets_S)
    assert restored.step == t.step
    with pytest.raises(ValueError, match="seconds_SK"):
        t.decide(BASE, table[:1])  # one unit's row for two units
    with pytest.raises(ValueError, match="seconds_SK"):
        t.decide(BASE, table[:, :BUCKETS[-1]])  # no column for k_max


def test_what_the_rule_cannot_read_is_an_error_not_a_kept_budget():
    table, fn = _table(np.array([1.0, 3.0]))
    t = tuner.Tuner(_config(), num_units=2, history=4)
    lo, hi = tuner.budget_bounds(BASE, t.config.p, t.config.k_max)
    # A table priced over a narrower range than the bounds: NaN compares False, so the rule
    # would keep every unit at the base without a word.
    for k in (lo, BASE, hi):
        unpriced = table.copy()
        unpriced[:, k] = np.nan
        with pytest.raises(ValueError, match=f"budgets {lo}..{hi} .*base budget {BASE}"):
            t.decide(BASE, unpriced)
    outside = table.copy()
    outside[:, hi + 1:] = np.nan
    outside[:, :lo] = np.nan
    t.decide(BASE, outside)  # what the rule never reads may be unpriced
    # A coverage curve shorter than the budgets the floor asks about.
    coverage_SK = np.ones((2, 10))
    with pytest.raises(ValueError, match=r"budgets 1..10; the rule asked for budget 14"):
        tuner.decide(table[:, BASE], BASE, coverage_SK, fn, _config(coverage_floor=0.9))
    # A saved state whose imbalance history does not fit this tuner.
    state = t.state_dict()
    state["history_imbalance_H2"] = [[1.0]]
    with pytest.raises(ValueError, match=r"history_imbalance_H2 has shape \(1, 1\)"):
        tuner.Tuner(_config(), num_units=2, history=4).load_state_dict(state)


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


def _reference_seconds_SK(model, doc_lengths_SMD, lo, hi, k_max, padded_tokens):
    """Unit s at budget k, one (unit, budget) at a time: its micro-batches' `predict_batch`,
    summed; NaN outside [lo, hi] (the layout of `shard_latency_table`)."""
    seconds_SK = np.full((len(doc_lengths_SMD), k_max + 1), np.nan)
    for s, lengths_MD in enumerate(doc_lengths_SMD):
        for k in range(lo, hi + 1):
            seconds_SK[s, k] = np.sum(model.predict_batch(lengths_MD, k,
                                                          padded_tokens=padded_tokens))
    return seconds_SK


def _reference_budgets(seconds_SK, ratio_S, error_S, coverage_SK, base, config):
    """The module docstring's rule written out per unit and per candidate budget."""
    def corrected(s, k):
        return seconds_SK[s, k] * ratio_S[s]

    target = {"mean": np.mean, "min": np.min, "max": np.max}[config.anchor](
        np.array([corrected(s, base) for s in range(len(seconds_SK))]))
    lo, hi = tuner.budget_bounds(base, config.p, config.k_max)  # its values: tested above
    if config.raise_within_bucket:
        hi = min(hi, min(b for b in config.buckets if b >= base))
    budgets = []
    for s in range(len(seconds_SK)):
        band = max(config.dead_band, error_S[s])
        chosen = base
        if corrected(s, base) > target * (1 + band):
            # Scanned from the base down to the first budget at or below the anchor; the
            # closest to the anchor wins, the larger budget on ties.
            scanned = [base]
            for k in range(base - 1, lo - 1, -1):
                scanned.append(k)
                if corrected(s, k) <= target:
                    break
            chosen = min(scanned, key=lambda k: (abs(corrected(s, k) - target), -k))
        elif corrected(s, base) < target * (1 - band):
            # The largest budget up to which every raise stays within the band below the anchor;
            # of budgets predicted as fast as that one, the smallest.
            top = max(k for k in range(base, hi + 1)
                      if all(corrected(s, j) <= target * (1 - band)
                             for j in range(base + 1, k + 1)))
            chosen = min(k for k in range(base, top + 1) if corrected(s, k) == corrected(s, top))
        if chosen < base and coverage_SK is not None:
            floor = config.coverage_floor
            meets = [k for k in range(lo, base + 1) if coverage_SK[s, k - 1] >= floor]
            chosen = max(chosen, min(meets, default=base))
        budgets.append(chosen)
    return np.array(budgets), target


@st.composite
def _step(draw):
    """A step's per-unit documents, tuner settings, EMA state and coverage."""
    S, M, D = draw(st.integers(1, 8)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    doc_lengths_SMD = draw(hnp.arrays(np.int64, (S, M, D), elements=st.integers(0, 40_000)))
    doc_lengths_SMD[..., 0] = np.maximum(doc_lengths_SMD[..., 0], 1)  # no empty micro-batch
    slack = draw(st.none() | st.integers(0, 4096))
    padded = None if slack is None else int(doc_lengths_SMD.sum(-1).max()) + slack
    buckets = draw(st.sampled_from([(16, 24), (8, 16, 24), (4, 6), (24,)]))
    config = tuner.TunerConfig(
        anchor=draw(st.sampled_from(tuner.ANCHORS)), p=draw(st.floats(0.1, 0.3)),
        coverage_floor=draw(st.floats(0.0, 1.0)), buckets=buckets,
        dead_band=draw(st.floats(0.0, 0.1)), raise_within_bucket=draw(st.booleans()))
    base = draw(st.integers(1, buckets[-1]))
    ratio_S = draw(hnp.arrays(np.float64, S, elements=st.floats(0.5, 2.0)))
    error_S = draw(hnp.arrays(np.float64, S, elements=st.floats(0.0, 0.2)))
    coverage_SK = draw(st.none() | hnp.arrays(np.float64, (S, buckets[-1]),
                                              elements=st.floats(0.0, 1.0)))
    if coverage_SK is not None:
        coverage_SK = np.sort(coverage_SK, axis=1)  # coverage rises with the budget
    return doc_lengths_SMD, padded, config, base, ratio_S, error_S, coverage_SK


_MODELS = {
    "analytic": latency.AnalyticLatencyModel(
        latency.LayerShape(d_model=896, num_heads=14, num_kv_heads=2, head_dim=64, mlp_dim=4864,
                           block_size=512)),
    "profiled_h200": latency.ProfiledLatencyModel.load(
        os.path.dirname(H200_TABLE), "NVIDIA H200",
        latency.LayerShape(d_model=896, num_heads=14, num_kv_heads=2, head_dim=64, mlp_dim=4864,
                           block_size=512, kernels="moba_mosaic")),
}


@pytest.mark.parametrize("model_name", list(_MODELS))
@settings(max_examples=150, deadline=None)
@given(step=_step())
def test_step_decision_matches_the_per_unit_per_budget_reference(model_name, step):
    # The tuner prices every candidate budget in one vectorised pass and scans with Python
    # floats; neither may change a prediction's bits or a decision.
    doc_lengths_SMD, padded, config, base, ratio_S, error_S, coverage_SK = step
    model = _MODELS[model_name]
    lo, hi = tuner.budget_bounds(base, config.p, config.k_max)
    seconds_SK = tuner.shard_latency_table(doc_lengths_SMD, model, config.k_max, padded,
                                           budget_range=(lo, hi))
    want_SK = _reference_seconds_SK(model, doc_lengths_SMD, lo, hi, config.k_max, padded)
    np.testing.assert_array_equal(seconds_SK, want_SK)

    t = tuner.Tuner(config, len(doc_lengths_SMD))
    t.ema.load_state_dict({"ratio_S": ratio_S.tolist(), "error_S": error_S.tolist(),
                           "count_S": [2] * len(ratio_S)})
    d = t.decide(base, seconds_SK, coverage_SK)
    want_S, anchor = _reference_budgets(want_SK, ratio_S, error_S, coverage_SK, base, config)
    np.testing.assert_array_equal(d.budgets_S, want_S)
    assert d.bucket == tuner.bucket_for(want_S, config.buckets)
    assert d.anchor_seconds == anchor
    units = range(len(want_S))
    np.testing.assert_array_equal(d.predicted_before_S,
                                  [want_SK[s, base] * ratio_S[s] for s in units])
    np.testing.assert_array_equal(d.predicted_after_S,
                                  [want_SK[s, want_S[s]] * ratio_S[s] for s in units])


def test_lazy_coverage_probes_once_and_only_when_asked():
    calls = []

    def probe():
        calls.append(1)
        return np.array([[0.2, 0.6, 0.9], [0.1, 0.5, 1.0]])

    unasked = tuner.LazyCoverage(probe)
    assert unasked.curve is None and not calls
    coverage = tuner.LazyCoverage(probe)
    assert coverage(0, 2) == 0.6 and coverage(1, 3) == 1.0 and coverage(1, 1) == 0.1
    assert len(calls) == 1 and coverage.curve.shape == (2, 3)


def test_dst_balancer_decides_on_the_probe_prefetched_for_that_batch():
    """DstBalancer.prefetch starts the probe of the next step batch; decide on that batch uses
    it (no second call) and its values reach the decision; decide on another batch probes
    that batch afresh."""
    from configs.longbench import get_config
    from sparsebalance_jax.config import from_config_dict
    from sparsebalance_jax.training import launch
    from sparsebalance_jax.training.budgets import DstBalancer

    raw = get_config("cpu")
    raw.mesh.data = 2
    raw.balance.update(dst=True, dead_band=0.0, coverage_floor=0.3)
    cfg = from_config_dict(raw, device_count=2)
    base, rows = cfg.attention.budget, cfg.data.rows_per_micro_batch
    calls = []

    def probe(step_batch, params):
        calls.append((step_batch["tag"], params))
        return np.tile(np.linspace(0.2, 1.0, base), (2, 1)) * (1 - 0.1 * step_batch["tag"])

    def step_batch(tag):
        # Shard 0 holds one long document, shard 1 short ones: DST weighs cutting shard 0.
        doc_lengths = np.zeros((2, cfg.data.micro_batches, 8), np.int64)
        doc_lengths[0, :, 0] = cfg.data.seq_len
        doc_lengths[1, :, :4] = cfg.data.seq_len // 8
        return {"tag": tag, "doc_lengths": doc_lengths,
                "budgets": np.full((2, cfg.data.micro_batches, rows), base, np.int32)}

    balancer = DstBalancer(cfg, launch.latency_model(cfg), probe)
    first, second = step_batch(0), step_batch(1)
    params = {"w": "params after step 0"}
    balancer.prefetch(lambda: first, params)
    assert calls == [(0, params)]
    decision = balancer.decide(first, params)
    assert calls == [(0, params)]  # the prefetched probe, not a second call
    assert decision.extra["tuner/probe_prefetched"] == 1.0
    assert decision.shard_budgets_S[0] < base  # a cut, checked against the probe's floor
    assert decision.extra["coverage/shard0_base"] == pytest.approx(1.0)
    for batch, with_params in ((second, params), (first, {"w": "other parameters"})):
        balancer.prefetch(lambda: first, params)
        decision = balancer.decide(batch, with_params)  # not what was prefetched: probed now
        assert calls[-1] == (batch["tag"], with_params) and len(calls) in (3, 5)
        assert decision.extra["tuner/probe_prefetched"] == 0.0
    assert decision.extra["coverage/shard0_base"] == pytest.approx(1.0)
    balancer.prefetch(lambda: None, params)  # the next batch could not be read: nothing
    assert len(calls) == 5 and balancer.decide(first, params).extra[
        "tuner/probe_prefetched"] == 0.0


def test_dst_balancer_restores_a_tuner_of_another_shard_count_afresh(capsys):
    """A resume at a window's end may change the data shards (train.resume_with_changes): the
    saved per-shard EMA then describes other shards, and the tuner starts afresh, saying so;
    with the same count it restores."""
    from configs.longbench import get_config
    from sparsebalance_jax.config import from_config_dict
    from sparsebalance_jax.training import launch
    from sparsebalance_jax.training.budgets import DstBalancer

    def balancer(shards):
        raw = get_config("cpu")
        raw.mesh.data = shards
        raw.balance.dst = True
        cfg = from_config_dict(raw, device_count=shards)
        return DstBalancer(cfg, launch.latency_model(cfg), lambda batch, params: None)

    two = balancer(2)
    two._tuner.observe(np.array([2.0, 1.0]), np.array([1.0, 1.0]))
    state = json.loads(json.dumps(two.get_state()))
    one = balancer(1)
    one.set_state(state)
    assert "is for 2 data shards, this run has 1" in capsys.readouterr().out
    assert one.get_state()["ema"]["count_S"] == [0]
    again = balancer(2)
    again.set_state(state)
    assert again.get_state() == state


def test_coverage_exactly_at_the_floor_meets_it():
    """Rule 3: the smallest budget whose coverage *reaches* the floor - equal counts."""
    load = np.array([3.0, 1.0, 1.0, 1.0])
    table, fn = _table(load)
    coverage_SK = np.ones((4, BUCKETS[-1]))
    coverage_SK[0] = np.where(np.arange(1, BUCKETS[-1] + 1) >= 16, 0.9, 0.5)
    floored = tuner.decide(table[:, BASE], BASE, coverage_SK, fn, _config(coverage_floor=0.9))
    assert floored[0] == 16  # free, it would drop to 14 (test_coverage_floor_stops_decreases_only)


def test_tuner_history_records_imbalance_before_then_after():
    load = np.random.default_rng().uniform(0.5, 2.0, size=6)
    table, _ = _table(load)
    t = tuner.Tuner(_config(), num_units=6, history=4)
    d = t.decide(BASE, table)
    before, after = d.predicted_before_S, d.predicted_after_S
    np.testing.assert_allclose(t.history_imbalance_H2[0],
                               [before.max() / before.mean(), after.max() / after.mean()])
    assert not np.isclose(*t.history_imbalance_H2[0])  # budgets moved: the two differ
    np.testing.assert_array_equal(t.history_budgets_HS[0], d.budgets_S)
