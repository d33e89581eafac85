"""Latency models: analytic block counts, table interpolation, missing-table error, EMA."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.stages import Compiled

from configs.longbench import get_config
from sparsebalance_jax.balance import latency, profiling
from sparsebalance_jax.config import AttentionConfig, ConfigError, ModelConfig, from_config_dict
from sparsebalance_jax.training import launch

TABLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "latency_tables")
SHAPE = latency.LayerShape(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128,
                           block_size=16)


def _brute_attended(n, k, block):
    nb = -(-n // block)
    return sum(min(k, i + 1) for i in range(nb)), sum(i for i in range(nb))


def test_block_counts_match_brute_force():
    rng = np.random.default_rng()
    lengths = rng.integers(1, 2000, size=50)
    budgets = rng.integers(1, 40, size=50)
    got = latency.attended_blocks(lengths, budgets, 16)
    gated = latency.gated_blocks(lengths, 16)
    for n, k, a, g in zip(lengths, budgets, got, gated):
        assert (a, g) == _brute_attended(int(n), int(k), 16)


def test_predict_adds_documents_and_padding():
    model = latency.AnalyticLatencyModel(SHAPE)
    lengths = np.array([100, 37, 250])
    whole = model.predict(lengths, 3, padded_tokens=512)
    parts = sum(model.predict([n], 3) for n in lengths)
    assert whole == pytest.approx(parts + (512 - lengths.sum()) * model.pad_seconds_per_token,
                                  rel=1e-12)
    batch = model.predict_batch(np.array([[100, 37, 250], [5, 0, 0]]), np.array([3, 1]),
                                padded_tokens=512)
    assert batch[0] == pytest.approx(whole, rel=1e-12)
    assert batch[1] == pytest.approx(model.predict([5], 1, padded_tokens=512), rel=1e-12)
    with pytest.raises(ValueError, match="padded_tokens"):
        model.predict([600], 3, padded_tokens=512)


def test_analytic_cost_grows_with_budget_only_past_the_budget():
    model = latency.AnalyticLatencyModel(SHAPE)
    # A document of 2 blocks attends to at most 2 blocks: budgets beyond that change nothing.
    assert model.predict([32], 2) == model.predict([32], 8)
    assert model.predict([320], 2) < model.predict([320], 8)


def _pad(lengths, call=0.0):
    """Padding-only rows' times: 1 ms per token plus a call's fixed part."""
    return tuple(call + 1e-3 * n for n in lengths)


def _table(rng):
    lengths = (64, 128, 512)
    budgets = (1, 4, 8)
    seconds = rng.uniform(1.0, 2.0, size=(3, 3)).cumsum(axis=0).cumsum(axis=1)
    return latency.LatencyTable(device_kind="cpu", shape=SHAPE, lengths=lengths, budgets=budgets,
                                seconds_LK=tuple(map(tuple, seconds)), pad_seconds_L=_pad(lengths))


def test_profiled_model_interpolates_bilinearly():
    table = _table(np.random.default_rng())
    model = latency.ProfiledLatencyModel(table)
    s = np.asarray(table.seconds_LK)
    for i, n in enumerate(table.lengths):
        for j, k in enumerate(table.budgets):
            assert model.predict([n], k) == pytest.approx(s[i, j], rel=1e-12)
    # Midway in both: the mean of the four corners.
    assert model.predict([96], 2.5) == pytest.approx(s[:2, :2].mean(), rel=1e-12)
    # Below the first length: linear to zero at length 0.
    assert model.predict([32], 1) == pytest.approx(s[0, 0] / 2, rel=1e-12)
    # Past the last length the last segment extends, where that is linear: the longest length,
    # 512 tokens = 32 blocks, exceeds budget 8's 8 blocks.
    slope = (s[2, 2] - s[1, 2]) / (512 - 128)
    assert model.predict([1024], 8) == pytest.approx(s[2, 2] + 512 * slope, rel=1e-12)
    with pytest.raises(ValueError, match="profiled range"):
        model.predict([100], 9)


def test_a_packed_call_pays_its_fixed_part_once():
    """The padding rows' intercept is a call's fixed part: a document alone predicts its
    row's time, and a micro-batch packing several pays the fixed part once, not per document."""
    lengths, call = (64, 128, 512), 0.25
    seconds = ((1.0, 1.5), (1.5, 2.5), (3.0, 6.0))
    table = latency.LatencyTable(device_kind="cpu", shape=SHAPE, lengths=lengths,
                                 budgets=(1, 4), seconds_LK=seconds,
                                 pad_seconds_L=_pad(lengths, call))
    assert table.call_seconds == pytest.approx(call, rel=1e-9)
    assert table.pad_seconds_per_token == pytest.approx(1e-3, rel=1e-9)
    model = latency.ProfiledLatencyModel(table)
    assert model.predict([128], 4) == pytest.approx(2.5, rel=1e-12)
    assert model.predict([64] * 4, 1) == pytest.approx(call + 4 * (1.0 - call), rel=1e-12)
    packed = model.predict_batch(np.array([[64, 64, 128]]), 4, padded_tokens=1024)[0]
    assert packed == pytest.approx(call + 2 * (1.5 - call) + (2.5 - call) + (1024 - 256) * 1e-3,
                                   rel=1e-12)
    # The json form keeps the measurements; a table without padding rows per length is refused.
    d = table.to_json_dict()
    assert latency.LatencyTable.from_json_dict(d) == table
    del d["pad_seconds_L"]
    with pytest.raises(ValueError, match="profile it again.*experiments.profile_latency"):
        latency.LatencyTable.from_json_dict(d)


def test_extrapolating_past_a_table_too_short_for_the_budget_names_file_and_command(tmp_path):
    # Blocks of 16 tokens. From k - 1 blocks on, each further block attends to k blocks: the
    # last segment (48 -> 64 tokens, 3 -> 4 blocks) is linear at budget 4 and extends; at
    # budget 8 it is not (it would need lengths from 7 blocks = 112 tokens on).
    table = latency.LatencyTable(device_kind="cpu", shape=SHAPE, lengths=(48, 64),
                                 budgets=(4, 8), seconds_LK=((1.5, 1.5), (2.0, 2.5)),
                                 pad_seconds_L=_pad((48, 64)))
    latency.save_table(str(tmp_path), table)
    model = latency.ProfiledLatencyModel.load(str(tmp_path), "cpu", SHAPE)
    assert model.predict([96], 4) == pytest.approx(3.0, rel=1e-12)
    assert model.predict([64], 8) == 2.5  # at the last length: no extrapolation
    path = latency.table_path(str(tmp_path), "cpu", SHAPE)
    with pytest.raises(ValueError, match=r"7 x 16 = 112 tokens \(its last segment starts at "
                                         r"48\)") as error:
        model.predict([96], 8)
    assert path in str(error.value)
    assert "experiments.profile_latency --config=configs/longbench.py --lengths=48,64,112,128" \
        in str(error.value)
    with pytest.raises(ValueError, match="112 tokens"):  # the tuner's path, one budget per row
        model.predict_per_budget(np.array([[96, 0]]), np.array([4, 8]))


def test_extrapolating_from_a_segment_inside_the_triangle_is_refused():
    # A layer whose time is linear in the blocks attended (blocks of 16, budget 4): from 3
    # blocks on each further block adds 4, before that 1, 2, 3. A table at (32, 64) tokens
    # ends on a segment from 2 blocks, whose slope (3.5 blocks a block) would underprice every
    # longer document; it is refused, and the lengths the message asks for extend exactly.
    def seconds(n):
        return 0.01 * n + 0.5 * float(latency.attended_blocks(np.array([n]), 4, 16)[0])

    def model(lengths):
        return latency.ProfiledLatencyModel(latency.LatencyTable(
            device_kind="cpu", shape=SHAPE, lengths=lengths, budgets=(4,),
            seconds_LK=tuple((seconds(n),) for n in lengths), pad_seconds_L=_pad(lengths)))

    short = model((32, 64))
    assert short.predict([64], 4) == pytest.approx(seconds(64), rel=1e-12)
    slope_inside = (seconds(64) - seconds(32)) / 32
    assert seconds(64) + 32 * slope_inside < seconds(96)  # what extending it would predict
    with pytest.raises(ValueError, match=r"3 x 16 = 48 tokens \(its last segment starts at "
                                         r"32\).*--lengths=32,48,64 "):
        short.predict([96], 4)
    assert model((32, 48, 64)).predict([96], 4) == pytest.approx(seconds(96), rel=1e-12)
    # Between profiled budgets the interpolation reads the next one's column: budget 3 on a
    # table profiled at 1 and 4 needs 4's segment (from 3 blocks), not 3's (from 2).
    lengths = (16, 32, 48, 64)
    table = latency.LatencyTable(
        device_kind="cpu", shape=SHAPE, lengths=lengths, budgets=(1, 4),
        seconds_LK=tuple((0.01 * n + 0.5 * n / 16, seconds(n)) for n in lengths),
        pad_seconds_L=_pad(lengths))
    latency.ProfiledLatencyModel(table).predict([96], 3)  # the segment 48 -> 64 is linear at 4
    table = dataclasses.replace(table, lengths=lengths[:3], seconds_LK=table.seconds_LK[:3],
                                pad_seconds_L=table.pad_seconds_L[:3])
    with pytest.raises(ValueError, match=r"budget 3 \(profiled budget 4\).* 3 x 16 = 48 tokens "
                                         r"\(its last segment starts at 32\)"):
        latency.ProfiledLatencyModel(table).predict([96], 3)


def test_table_time_never_falls_as_the_budget_rises():
    # A dip is timing noise (more budget is never less work): a falling run takes its mean.
    table = latency.LatencyTable(
        device_kind="cpu", shape=SHAPE, lengths=(16, 32, 64), budgets=(1, 2, 4),
        seconds_LK=((1.0, 0.5, 1.25), (2.0, 3.0, 2.2), (4.0, 3.0, 2.0)),
        pad_seconds_L=_pad((16, 32, 64)))
    assert table.fitted_seconds_LK == ((0.75, 0.75, 1.25), (2.0, 2.6, 2.6), (3.0, 3.0, 3.0))
    # The measurements themselves are kept, and saved: the fit is made again on loading.
    assert table.seconds_LK == ((1.0, 0.5, 1.25), (2.0, 3.0, 2.2), (4.0, 3.0, 2.0))
    assert latency.LatencyTable.from_json_dict(table.to_json_dict()) == table
    # Equal neighbours interpolate to exactly their value: the tuner compares such predictions.
    model = latency.ProfiledLatencyModel(table)
    np.testing.assert_array_equal(
        model.doc_seconds(np.array([32]), np.linspace(2, 4, 21)), [2.6] * 21)
    at_K = model.predict_per_budget(np.array([[48, 40]]), np.linspace(1, 4, 31))[:, 0]
    assert np.all(np.diff(at_K) >= 0)


def test_table_time_never_falls_as_the_length_rises():
    # A longer document is never less work either: after each row's fit, a column that falls
    # with the length is carried at its running maximum (the rows stay non-decreasing).
    lengths = (16, 32, 64)
    table = latency.LatencyTable(
        device_kind="cpu", shape=SHAPE, lengths=lengths, budgets=(1, 2),
        seconds_LK=((1.0, 2.0), (2.0, 2.5), (1.5, 3.0)), pad_seconds_L=_pad(lengths))
    assert table.fitted_seconds_LK == ((1.0, 2.0), (2.0, 2.5), (2.0, 3.0))
    model = latency.ProfiledLatencyModel(table)
    # Past the table the extension is flat at budget 1, where the raw last segment fell (to
    # below zero by 192 tokens): 2.0 at any length; budget 2 rises by 0.5 per 32 tokens.
    np.testing.assert_allclose(model.doc_seconds(np.array([64, 96, 6400]), 1), [2.0] * 3,
                               rtol=1e-12)
    np.testing.assert_allclose(model.doc_seconds(np.array([96, 6400]), 2), [3.5, 3.0 + 99],
                               rtol=1e-12)


def test_extending_past_the_table_keeps_latency_rising_with_the_budget():
    # The longer length's time rose less with k than the shorter one's (timing noise), so the
    # last segment's raw slopes per 16 tokens, (1.0, 0.6, 0.2), fall with k: extended linearly,
    # a 128-token document would read 6.0 / 4.5 / 3.0 at budgets 1 / 2 / 4. The slopes are
    # made non-decreasing (a falling run takes its mean, 0.6), so it reads 4.4 / 4.5 / 4.6.
    lengths = (48, 64)
    table = latency.LatencyTable(
        device_kind="cpu", shape=SHAPE, lengths=lengths, budgets=(1, 2, 4),
        seconds_LK=((1.0, 1.5, 2.0), (2.0, 2.1, 2.2)), pad_seconds_L=_pad(lengths))
    model = latency.ProfiledLatencyModel(table)
    np.testing.assert_allclose(model.doc_seconds(np.array([128]), np.array([1, 2, 4])),
                               [4.4, 4.5, 4.6], rtol=1e-12)
    # Inside the table nothing changes: the measured rows at their lengths and between them.
    np.testing.assert_allclose(model.doc_seconds(np.array([48, 56, 64]), 2), [1.5, 1.8, 2.1],
                               rtol=1e-12)


def test_noisy_tables_predict_latency_rising_with_length_and_budget():
    # Whatever noise a profile holds, the model's predictions rise (weakly) with the budget and
    # the length, inside the table and past it, and stay positive.
    rng = np.random.default_rng()
    lengths, budgets = (64, 128, 256, 512), (1, 2, 4, 8)
    grid_n = np.arange(0, 4097, 16)
    grid_k = np.linspace(1, 8, 29)
    for _ in range(20):
        seconds = rng.uniform(0.5, 4.0, size=(len(lengths), len(budgets)))
        table = latency.LatencyTable(
            device_kind="cpu", shape=SHAPE, lengths=lengths, budgets=budgets,
            seconds_LK=tuple(map(tuple, seconds)), pad_seconds_L=_pad(lengths, 0.1))
        model = latency.ProfiledLatencyModel(table)
        nk = model.doc_seconds(grid_n[:, None], grid_k[None, :])
        assert np.all(nk[1:] >= 0), seconds
        assert np.all(np.diff(nk, axis=0) >= -1e-12), seconds
        assert np.all(np.diff(nk, axis=1) >= -1e-12), seconds


def test_checked_in_tables_load_and_hold_what_the_model_assumes():
    # The tables the GPU runs read. What construction does not impose (rows are made
    # non-decreasing in k, the call's part clipped): the time rises with the length at every
    # budget, the longest length's with the budget (the table sees the sparse work), and the
    # padding rows' own line meets zero tokens inside [0, the fastest entry] unclipped.
    files = sorted(f for f in os.listdir(TABLES) if f.endswith(".json"))
    assert files, f"no latency table in {TABLES}"
    for name in files:
        with open(os.path.join(TABLES, name)) as f:
            raw = json.load(f)
        table = latency.LatencyTable.from_json_dict(raw)
        seconds_LK = np.array(table.seconds_LK)
        assert np.all(np.diff(seconds_LK, axis=0) > 0), name
        assert seconds_LK[-1, -1] > 1.5 * seconds_LK[-1, 0], name
        slope, intercept = np.polyfit(np.array(raw["lengths"], float), raw["pad_seconds_L"], 1)
        assert 0 <= intercept <= seconds_LK.min() and slope > 0, name
        assert table.call_seconds == pytest.approx(intercept), name


@pytest.mark.parametrize("kind", ["analytic", "profiled", "profiled_one_budget"])
def test_predict_per_budget_is_predict_batch_at_each_budget(kind):
    rng = np.random.default_rng()
    if kind == "analytic":
        model, budgets_K = latency.AnalyticLatencyModel(SHAPE), np.arange(1, 12)
    elif kind == "profiled":
        model, budgets_K = latency.ProfiledLatencyModel(_table(rng)), np.arange(1, 9)
    else:
        one = latency.LatencyTable(device_kind="cpu", shape=SHAPE, lengths=(64, 128),
                                   budgets=(4,), seconds_LK=((1.0,), (3.0,)),
                                   pad_seconds_L=(0.5 + 64e-3, 0.5 + 128e-3))
        model, budgets_K = latency.ProfiledLatencyModel(one), np.array([4])
    lengths_BD = rng.integers(0, 700, size=(6, 5))  # zeros are padding entries
    lengths_BD[0] = 0  # an empty micro-batch
    for padded in (None, 4096):
        got_KB = model.predict_per_budget(lengths_BD, budgets_K, padded_tokens=padded)
        want_KB = np.stack([model.predict_batch(lengths_BD, k, padded_tokens=padded)
                            for k in budgets_K])
        # Bit for bit: the tuner's decisions compare these values with each other.
        np.testing.assert_array_equal(got_KB, want_KB)
    if kind != "analytic":
        with pytest.raises(ValueError, match="profiled range"):
            model.predict_per_budget(lengths_BD, budgets_K + 1)


def test_table_round_trip_and_missing_table_names_the_command(tmp_path):
    table = _table(np.random.default_rng())
    folder = str(tmp_path / "tables")
    with pytest.raises(FileNotFoundError, match="experiments.profile_latency --config="):
        latency.ProfiledLatencyModel.load(folder, "cpu", SHAPE)
    path = latency.save_table(folder, table)
    loaded = latency.ProfiledLatencyModel.load(folder, "cpu", SHAPE)
    assert loaded.table == table
    with pytest.raises(FileNotFoundError, match="experiments.profile_latency --config="):
        latency.ProfiledLatencyModel.load(folder, "NVIDIA H200", SHAPE)
    with open(path) as f:
        assert json.load(f)["device_kind"] == "cpu"
    # A table measured with other attention kernels is not this one's.
    with pytest.raises(FileNotFoundError, match="moba_mosaic"):
        latency.ProfiledLatencyModel.load(folder, "cpu",
                                          dataclasses.replace(SHAPE, kernels="moba_mosaic"))


def _layer_configs(implementation: str, moba_backend: str):
    """A one-layer model config and an attention config (block 16), tiny enough for CPU."""
    model_cfg = ModelConfig(vocab_size=128, num_layers=1, d_model=32, num_heads=2, num_kv_heads=1,
                            head_dim=16, mlp_dim=64, rope_theta=1e4, rms_eps=1e-6,
                            param_dtype="float32", compute_dtype="float32", remat=False,
                            remat_keep=(), scan_layers=True)
    attention_cfg = AttentionConfig(implementation=implementation, block_size=16, budget=1,
                                    budget_buckets=(2,), layer_budget_scale=(), interpret=True,
                                    moba_backend=moba_backend)
    return model_cfg, attention_cfg


def test_layer_shape_keys_the_attention_kernels():
    model_cfg, attention = _layer_configs("moba", "mosaic")
    shape = latency.LayerShape.from_configs(model_cfg, attention)
    assert shape.key() == "d32_h2_kv1_hd16_mlp64_blk16_moba_mosaic"
    dense = dataclasses.replace(attention, implementation="cudnn")
    assert latency.LayerShape.from_configs(model_cfg, dense).kernels == "cudnn"
    with pytest.raises(ValueError, match="kernels"):
        dataclasses.replace(shape, kernels="moba mosaic")


def test_ema_correction_first_sets_then_blends_and_round_trips():
    ema = latency.EmaCorrection(3, decay=0.5)
    predicted = np.array([1.0, 2.0, 4.0])
    ema.update(np.array([2.0, 2.0, 2.0]), predicted)
    np.testing.assert_allclose(ema.ratio_S, [2.0, 1.0, 0.5])
    ema.update(np.array([1.0, 2.0, 4.0]), predicted)
    np.testing.assert_allclose(ema.ratio_S, [1.5, 1.0, 0.75])
    np.testing.assert_allclose(ema.correct(predicted), [1.5, 2.0, 3.0])
    # Error: none after one observation; then |observed / ratio before - 1|, then blended.
    np.testing.assert_allclose(ema.error_S, [0.5, 0.0, 1.0])
    ema.update(np.array([1.5, 2.0, 1.5]), predicted)
    np.testing.assert_allclose(ema.error_S, [0.25, 0.0, 0.75])
    other = latency.EmaCorrection(3, decay=0.5)
    other.load_state_dict(json.loads(json.dumps(ema.state_dict())))
    np.testing.assert_array_equal(other.ratio_S, ema.ratio_S)
    np.testing.assert_array_equal(other.error_S, ema.error_S)
    with pytest.raises(ValueError, match="3 shards"):
        latency.EmaCorrection(4).load_state_dict(ema.state_dict())
    with pytest.raises(ValueError, match="error_S for 1 shards"):
        other.load_state_dict(dict(ema.state_dict(), error_S=[0.1]))
    # A state saved before the error EMA existed loads with the error at zero.
    old = {k: v for k, v in ema.state_dict().items() if k != "error_S"}
    other.load_state_dict(old)
    np.testing.assert_array_equal(other.ratio_S, ema.ratio_S)
    np.testing.assert_array_equal(other.error_S, np.zeros(3))


def test_make_latency_model_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'flops'"):
        latency.make_latency_model("flops", SHAPE)


def test_profile_layer_makes_a_loadable_table(tmp_path):
    # The dense reference attention keeps this fast on CPU; the GPU profile uses MoBA.
    model_cfg, attention_cfg = _layer_configs("reference", "triton")
    table = profiling.profile_layer(model_cfg, attention_cfg, (16, 32), (1, 2), repeats=1,
                                    log=lambda _: None)
    assert table.shape.key() == "d32_h2_kv1_hd16_mlp64_blk16_reference"
    latency.save_table(str(tmp_path), table)
    model = latency.ProfiledLatencyModel.load(str(tmp_path), table.device_kind, table.shape)
    assert model.predict([32], 2) == pytest.approx(table.fitted_seconds_LK[1][1], rel=1e-12)
    with pytest.raises(ValueError, match="multiples of attention.block_size"):
        profiling.profile_layer(model_cfg, attention_cfg, (20,), (1,), log=lambda _: None)


def test_profile_times_each_distinct_program_once_compiled(monkeypatch):
    timed = []

    def fake_time_call(fn, *args, repeats):
        # Each timing returns a new value, as real timings (noise) would.
        assert isinstance(fn, Compiled)  # compiled before timing: warm-up runs compiled code
        timed.append(int(args[-1][0]))
        return 1.0 + len(timed)

    monkeypatch.setattr(profiling, "time_call", fake_time_call)
    model_cfg, attention_cfg = _layer_configs("reference", "triton")
    # Lengths of 1, 2 and 4 blocks of 16; budgets past a length's blocks run its block count.
    table = profiling.profile_layer(model_cfg, attention_cfg, (16, 32, 64), (1, 2, 3, 4),
                                    repeats=1, log=lambda _: None)
    # Each length's distinct budgets, then its padding-only row (budget 1).
    assert timed == [1, 1, 1, 2, 1, 1, 2, 3, 4, 1]
    s = table.seconds_LK
    assert s[0] == (2.0,) * 4 and s[1] == (4.0, 5.0, 5.0, 5.0) and s[2] == (7.0, 8.0, 9.0, 10.0)
    assert table.pad_seconds_L == (3.0, 6.0, 11.0)


def test_a_table_that_cannot_price_the_run_stops_it_at_launch(tmp_path):
    """The launch asks the cost model for the longest document at every budget the run may
    price: a profiled table too short for it is a config error naming balance.latency_table
    (before the work directory is written), not an error at the first batch."""
    raw = get_config("cpu")
    raw.balance.update(latency_model="profiled", latency_table=str(tmp_path))
    cfg = from_config_dict(raw, device_count=2)
    shape = latency.LayerShape.from_configs(cfg.model, cfg.attention)
    lengths = (64, 128, 256)
    assert cfg.data.max_doc_len > lengths[-1]
    latency.save_table(str(tmp_path), latency.LatencyTable(
        device_kind=jax.devices()[0].device_kind, shape=shape, lengths=lengths, budgets=(1, 2, 4),
        seconds_LK=tuple((1e-3 * n, 2e-3 * n, 3e-3 * n) for n in lengths),
        pad_seconds_L=_pad(lengths)))
    with pytest.raises(ConfigError, match=r"balance\.latency_table: a document of "
                                          rf"{cfg.data.max_doc_len} tokens is longer"):
        launch.latency_model(cfg)
    raw.data.max_doc_len = 256  # within the table: it prices every budget
    assert launch.latency_model(from_config_dict(raw, device_count=2)).block_size == 64


def test_ema_blends_with_weight_one_minus_decay():
    """The EMA keeps `decay` of the old ratio and error and takes 1 - decay of the new one; an
    asymmetric decay tells the two weights apart (0.5 cannot)."""
    ema = latency.EmaCorrection(1, decay=0.75)
    one = np.ones(1)
    ema.update(np.array([2.0]), one)  # first: set outright
    ema.update(np.array([1.0]), one)  # ratio 0.75 * 2 + 0.25 * 1; miss |1 / 2 - 1|
    np.testing.assert_allclose(ema.ratio_S, [1.75], rtol=1e-12)
    np.testing.assert_allclose(ema.error_S, [0.5], rtol=1e-12)
    ema.update(np.array([3.5]), one)  # miss |3.5 / 1.75 - 1| = 1
    np.testing.assert_allclose(ema.ratio_S, [0.75 * 1.75 + 0.25 * 3.5], rtol=1e-12)
    np.testing.assert_allclose(ema.error_S, [0.75 * 0.5 + 0.25 * 1.0], rtol=1e-12)


def test_profiled_fingerprint_follows_every_table_number():
    """A batcher's saved state refuses a half-planned window under another cost model by its
    fingerprint, so a table differing in any one measured number must fingerprint apart, and
    the same numbers (a table read back) alike."""
    table = _table(np.random.default_rng())
    base = latency.ProfiledLatencyModel(table).fingerprint()
    again = latency.LatencyTable.from_json_dict(json.loads(json.dumps(table.to_json_dict())))
    assert latency.ProfiledLatencyModel(again).fingerprint() == base
    seconds = [list(row) for row in table.seconds_LK]
    seconds[1][2] *= 1.01
    pads = list(table.pad_seconds_L)
    pads[0] *= 1.01
    variants = [dataclasses.replace(table, seconds_LK=tuple(map(tuple, seconds))),
                dataclasses.replace(table, pad_seconds_L=tuple(pads)),
                dataclasses.replace(table, device_kind="other")]
    prints = {latency.ProfiledLatencyModel(t).fingerprint() for t in variants}
    assert len(prints) == 3 and base not in prints


def test_profile_times_padding_on_padding_and_each_budget_the_kernel_runs(monkeypatch):
    """The padding-only timing runs the step on segment ids 0 (the budget rows on one
    document, ids 1); a budget past a length's blocks runs, and is timed at, the block count
    (budgets 2 and 3 on a one-block length: one timing at 1; on two blocks one at 2)."""
    timed = []

    def fake_time_call(fn, params, x, segment_ids, budget, *, repeats):
        timed.append((int(jnp.sum(segment_ids)), segment_ids.size, int(budget[0])))
        return 1.0 + len(timed)

    monkeypatch.setattr(profiling, "time_call", fake_time_call)
    model_cfg, attention_cfg = _layer_configs("reference", "triton")
    table = profiling.profile_layer(model_cfg, attention_cfg, (16, 32), (2, 3), repeats=1,
                                    log=lambda _: None)
    assert timed == [(16, 16, 1), (0, 16, 1), (32, 32, 2), (0, 32, 1)]
    assert table.seconds_LK == ((2.0, 2.0), (4.0, 4.0)) and table.pad_seconds_L == (3.0, 5.0)
