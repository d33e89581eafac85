"""Per-shard timing: the two-program step makes the fused step's update, its first program has
no collective, each shard gets a time, and the times reach the tuner's EMA in the loop."""

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from configs.longbench import get_config
from sparsebalance_jax.config import ConfigError, MeshConfig, from_config_dict
from sparsebalance_jax.model import Transformer
from sparsebalance_jax.sharding import make_mesh
from sparsebalance_jax.training import launch, loop
from sparsebalance_jax.training.metrics import read_metrics
from sparsebalance_jax.training.state import create_train_state
from sparsebalance_jax.training.step import (ShardTimedStep, batch_shardings, compile_train_step,
                                             shard_batch_shardings, to_step_layout)
from tests.test_model import packed_inputs, tiny_config
from tests.test_sharding import F32

SHARDS, MICRO, ROWS, SEQ = 4, 2, 2, 64


def _pipeline_batch(rng, k_max):
    """Pipeline layout [S, M, R, T], ragged budgets in [1, k_max] per shard (a budget past k_max
    makes its row NaN)."""
    n = SHARDS * MICRO * ROWS
    tokens, seg, pos = packed_inputs(rng, n, SEQ, [0, 16, 48])
    shape = (SHARDS, MICRO, ROWS, SEQ)
    return dict(inputs=np.asarray(tokens).reshape(shape),
                targets=np.roll(np.asarray(tokens), -1, axis=1).reshape(shape),
                loss_mask=(rng.random(shape) < 0.8).astype(np.float32),
                segment_ids=np.asarray(seg).reshape(shape),
                positions=np.asarray(pos).reshape(shape),
                budgets=rng.integers(1, k_max + 1, (SHARDS, MICRO, ROWS)).astype(np.int32))


@pytest.mark.parametrize("implementation", ["reference", "moba"])
def test_timed_step_makes_the_fused_update(implementation):
    cfg = tiny_config(implementation)
    cfg = dataclasses.replace(cfg, mesh=MeshConfig(SHARDS, 1, 1))
    mesh = make_mesh(cfg.mesh, jax.devices()[:SHARDS])
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    batch = _pipeline_batch(np.random.default_rng(), cfg.k_max)

    state, shardings = create_train_state(cfg, mesh, model, jax.random.key(0))
    params0 = jax.tree.map(np.asarray, state.params)
    fused_state, fused_metrics = compile_train_step(model, mesh, shardings)(
        state, jax.device_put(to_step_layout(batch), batch_shardings(mesh)))
    fused = jax.tree.map(lambda new, old: np.asarray(new) - old, fused_state.params, params0)

    state, shardings = create_train_state(cfg, mesh, model, jax.random.key(0))
    # MoBA's timed step with its layers rematerialised, keeping the attention and the MLP's
    # projections (model.remat_keep): the same update as the fused step without remat.
    timed_model = (dataclasses.replace(cfg.model, remat=True, remat_keep=("attention", "mlp"))
                   if implementation == "moba" else cfg.model)
    timed_step = ShardTimedStep(timed_model, cfg.attention, mesh, shardings,
                                cfg.attention.budget_buckets)
    placed = jax.device_put(batch, shard_batch_shardings(mesh))
    compiled = timed_step.local.compiled(cfg.k_max, state.params, placed)
    hlo = compiled.as_text()
    assert not any(op in hlo for op in ("all-reduce", "all-gather", "reduce-scatter",
                                        "collective-permute", "all-to-all"))
    timed_state, metrics, shard_seconds = timed_step(cfg.k_max, state, placed)
    timed = jax.tree.map(lambda new, old: np.asarray(new) - old, timed_state.params, params0)

    assert np.isfinite(float(fused_metrics["loss"]))
    assert all(np.abs(u).max() > 0 for u in jax.tree.leaves(fused))  # the step moved all
    for key in ("loss", "tokens", "grad_norm"):
        np.testing.assert_allclose(float(metrics[key]), float(fused_metrics[key]), **F32)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **F32), timed, fused)
    # The program's first run is not timed (it reads far above the steady state), though this
    # call did not compile it; the next is.
    assert shard_seconds is None
    shard_seconds = timed_step.time_shards(cfg.k_max, timed_state.params, placed)
    assert shard_seconds.shape == (SHARDS,) and np.all(shard_seconds > 0)
    assert timed_step.compiles == 1


def test_shard_timing_needs_a_data_only_mesh():
    raw = get_config("cpu")
    raw.balance.shard_timing = True
    raw.mesh.update(data=1, fsdp=2)
    with pytest.raises(ConfigError, match="balance.shard_timing: .*mesh.fsdp = mesh.tensor = 1"):
        from_config_dict(raw)


def test_loop_logs_shard_times_and_feeds_the_tuner(tmp_path, monkeypatch):
    raw = get_config("cpu")
    raw.balance.shard_timing = True
    raw.train.update(num_steps=3, workdir=str(tmp_path), checkpoint_every=3)
    raw.optimizer.warmup_steps = 1
    raw.model.update(num_layers=1, d_model=64, mlp_dim=128)
    raw.data.update(seq_len=512, max_doc_len=512, min_doc_len=32, length_scale=0.01,
                    synthetic_weight=0.0)
    cfg = from_config_dict(raw)  # data = 2 of the 8 host devices
    cost = launch.latency_model(cfg)
    balancer = launch.make_balancer(cfg, cost)
    monkeypatch.setattr(loop, "make_mesh",
                        lambda mesh_cfg: make_mesh(mesh_cfg, jax.devices()[:2]))
    loop.train(cfg, launch.data_iterator(cfg, cost), balancer, show_progress=False)
    metrics = read_metrics(str(tmp_path))
    assert "shard_ms/shard0" not in metrics[1]  # the compiling step is not timed
    for step in (2, 3):
        assert metrics[step]["shard_ms/shard0"] > 0 and metrics[step]["shard_ms/shard1"] > 0
        assert metrics[step]["imbalance_measured"] >= 1.0
    ema = balancer.get_state()["ema"]
    assert ema["count_S"] == [2, 2] and all(r > 0 for r in ema["ratio_S"])
    # Steps 2 and 3 decide on the probe the loop prefetched while the step before ran.
    assert [metrics[step]["tuner/probe_prefetched"] for step in (1, 2, 3)] == [0.0, 1.0, 1.0]


@pytest.mark.gpu
def test_gpu_shard_times_follow_each_shards_own_work():
    """Two GPUs, one 32K document per row: the shard at budget 24 must take clearly longer than
    the one at budget 1 (one layer: ~33 vs ~11 ms on an H200), equal budgets about as long."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 GPUs (data-parallel shards on separate devices)")
    raw = get_config("gpu")
    raw.model.num_layers = 2
    raw.mesh.data = 2
    raw.attention.update(block_size=512, budget=16, budget_buckets=(24,))
    cfg = from_config_dict(raw)
    mesh = make_mesh(cfg.mesh, jax.devices()[:2])
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    state, shardings = create_train_state(cfg, mesh, model, jax.random.key(0))
    step = ShardTimedStep(cfg.model, cfg.attention, mesh, shardings, (24,))
    rng = np.random.default_rng()
    shape = (2, 1, 1, cfg.data.seq_len)
    tokens = rng.integers(0, 256, shape).astype(np.int32)
    base = dict(inputs=tokens, targets=np.roll(tokens, -1, axis=-1),
                loss_mask=np.ones(shape, np.float32), segment_ids=np.ones(shape, np.int32),
                positions=np.broadcast_to(np.arange(shape[-1], dtype=np.int32), shape))

    def median_seconds(budgets):
        nonlocal state
        batch = jax.device_put(dict(base, budgets=np.asarray(budgets, np.int32).reshape(2, 1, 1)),
                               shard_batch_shardings(mesh))
        times = []
        for _ in range(6):
            state, _, seconds = step(24, state, batch)
            times.append(seconds)
        return np.median(np.array(times[1:]), axis=0)

    assert step.device_clock
    ragged = median_seconds([24, 1])
    even = median_seconds([12, 12])
    print(f"budgets 24 / 1: shard ms {1e3 * ragged}; 12 / 12: {1e3 * even}")
    assert ragged[0] > 1.3 * ragged[1], ragged
    assert 0.85 < even[0] / even[1] < 1.15, even


@pytest.mark.gpu
def test_gpu_equal_shards_read_equal_on_the_study_model():
    """The accuracy-study model (8 layers, 2 x 2 rows of 8K per shard) at one budget: timed from
    the host's dispatch, the second GPU read ~13 ms (~20%) later at every step; the device
    clock must read the two shards within 10% of each other."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 GPUs (data-parallel shards on separate devices)")
    from configs.accuracy_study import get_config as study_config
    cfg = from_config_dict(study_config("moba,gpu"))
    mesh = make_mesh(cfg.mesh, jax.devices()[:2])
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    state, shardings = create_train_state(cfg, mesh, model, jax.random.key(0))
    step = ShardTimedStep(cfg.model, cfg.attention, mesh, shardings, cfg.attention.budget_buckets)
    rng = np.random.default_rng()
    shape = (2, cfg.data.micro_batches, cfg.data.rows_per_micro_batch, cfg.data.seq_len)
    tokens = rng.integers(0, 256, shape).astype(np.int32)
    batch = jax.device_put(dict(
        inputs=tokens, targets=np.roll(tokens, -1, axis=-1), loss_mask=np.ones(shape, np.float32),
        segment_ids=np.ones(shape, np.int32),
        positions=np.broadcast_to(np.arange(shape[-1], dtype=np.int32), shape),
        budgets=np.full(shape[:3], cfg.attention.budget, np.int32)), shard_batch_shardings(mesh))
    times = []
    for _ in range(10):
        state, _, seconds = step(cfg.k_max, state, batch)
        if seconds is not None:
            times.append(seconds)
    median = np.median(np.array(times[1:]), axis=0)
    print(f"study model, equal budgets: device-clock shard ms {1e3 * median}")
    assert 0.9 < median[1] / median[0] < 1.1, median


def test_device_clock_is_gpu_only_and_wraps():
    from pallas_kernels import device_clock
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a GPU"):
            device_clock.read_clock(np.zeros(3, np.int32))
    # A reading pair across the counter's 2^32 ns wrap: -5 is 2^32 - 5 ns.
    start = np.full((2, 16), -5, np.int32)
    end = np.array([[1000] * 16, [7] * 16], np.int32)
    np.testing.assert_allclose(device_clock.elapsed_seconds(start, end), [1005e-9, 12e-9])
    # A 5 s program reads 5 - 4.294967296 s on the low 32 bits; the host's 5.2 s restores it.
    five = np.full((1, 16), 5_000_000_000 % (1 << 32), np.int64).astype(np.uint32).view(np.int32)
    zero = np.zeros((1, 16), np.int32)
    np.testing.assert_allclose(device_clock.elapsed_seconds(zero, five), [5 - 2 ** 32 / 1e9])
    np.testing.assert_allclose(device_clock.elapsed_seconds(zero, five, at_most_seconds=5.2), [5.0])
    np.testing.assert_allclose(device_clock.elapsed_seconds(start, end, at_most_seconds=0.1),
                               [1005e-9, 12e-9])


def _stand_in_clock(monkeypatch, read=lambda dep: 0 * dep):
    """device_clock.read_clock replaced for the CPU (its inline PTX needs a GPU): [16] int32
    of read(dep's first element), which keeps the data dependency the real reading has."""
    from pallas_kernels import device_clock
    monkeypatch.setattr(device_clock, "read_clock", lambda dep: jnp.zeros((16,), jnp.int32)
                        + read(dep.reshape(-1)[0].astype(jnp.int32)))
    return device_clock


def test_clocked_reads_the_clock_around_the_whole_program(monkeypatch):
    """device_clock.clocked's order on the CPU (the clock itself needs a GPU): the first
    reading depends on every numeric operand, fn's equations only on the first barrier's
    outputs, the second reading on the second barrier, which holds fn's every result; and
    the results come back unchanged."""
    device_clock = _stand_in_clock(monkeypatch, read=lambda dep: dep)
    fn = lambda x, n: (x @ x.T, x.sum() + n)
    x, n = jnp.arange(12.0).reshape(3, 4), jnp.int32(2)
    (out, clock_2L) = jax.jit(device_clock.clocked(fn))(x, n)
    np.testing.assert_allclose(out[0], fn(x, n)[0])
    np.testing.assert_allclose(out[1], fn(x, n)[1])
    assert clock_2L.shape == (2, 16)
    jaxpr = jax.make_jaxpr(device_clock.clocked(fn))(x, n).jaxpr
    barriers = [i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "optimization_barrier"]
    assert len(barriers) == 2
    first, second = (jaxpr.eqns[i] for i in barriers)
    assert set(map(str, jaxpr.invars)) <= set(map(str, first.invars))  # every operand
    # fn's equations sit between the barriers and read the first one's outputs, never the
    # raw operands.
    body = jaxpr.eqns[barriers[0] + 1:barriers[1]]
    assert any(e.primitive.name == "dot_general" for e in body)
    assert not any(set(map(str, e.invars)) & set(map(str, jaxpr.invars)) for e in body)
    assert not any(e.primitive.name == "dot_general" for e in jaxpr.eqns[barriers[1]:])
    # The second barrier holds both results and the first reading; the end reading is made
    # from that reading as it leaves the barrier, and from nothing else.
    assert len(second.invars) == 3 and str(second.invars[2]) == str(first.outvars[0])
    after = jaxpr.eqns[barriers[1] + 1:]
    made = {str(second.outvars[2])}
    for e in after:
        assert {str(v) for v in e.invars if not isinstance(v, jax.extend.core.Literal)} <= made, e
        made |= set(map(str, e.outvars))


def test_time_on_device_compiles_once_per_shape(monkeypatch):
    """The contract bench_kernel relies on: a clocked_call, built once and timed by
    time_on_device for each new budget (data of the same shapes), compiles once. On the CPU
    the clock is a stand-in that reads 0, so the device time is 0 and only the wall time is
    real."""
    from sparsebalance_jax.balance import timing
    _stand_in_clock(monkeypatch)
    clocked = timing.clocked_call(lambda x, k: (x * k).sum())
    for k in (2, 3, 16):
        wall, span = timing.time_on_device(clocked, jnp.ones((8, 8)), jnp.int32(k), repeats=2)
        assert wall > 0 and span == 0.0
    assert clocked._cache_size() == 1
    with pytest.raises(ValueError, match="repeats"):
        timing.time_on_device(clocked, jnp.ones((8, 8)), jnp.int32(2), repeats=0)


def test_clocked_shard_program_matches_the_unclocked_one(monkeypatch):
    """The GPU's path of ShardTimedStep (each shard's program between two clock readings,
    device_clock.clocked under shard_map) on the CPU's fake devices, the clock a stand-in that
    reads 0: the same update as the host-timed path, one clock pair per shard, no collective."""
    _stand_in_clock(monkeypatch)
    cfg = dataclasses.replace(tiny_config("reference"), mesh=MeshConfig(SHARDS, 1, 1))
    mesh = make_mesh(cfg.mesh, jax.devices()[:SHARDS])
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    batch = _pipeline_batch(np.random.default_rng(), cfg.k_max)
    runs = {}
    for clocked in (False, True):
        state, shardings = create_train_state(cfg, mesh, model, jax.random.key(0))
        with monkeypatch.context() as m:
            m.setattr(jax, "default_backend", lambda: "gpu" if clocked else "cpu")
            timed_step = ShardTimedStep(cfg.model, cfg.attention, mesh, shardings,
                                        cfg.attention.budget_buckets)
        assert timed_step.device_clock == clocked
        placed = jax.device_put(batch, shard_batch_shardings(mesh))
        hlo = timed_step.local.compiled(cfg.k_max, state.params, placed).as_text()
        assert "all-reduce" not in hlo and "all-gather" not in hlo
        state, _, _ = timed_step(cfg.k_max, state, placed)  # a program's first run is not timed
        runs[clocked] = timed_step(cfg.k_max, state, placed)
    (plain_state, plain_metrics, _), (state, metrics, seconds) = runs[False], runs[True]
    for key in ("loss", "tokens", "grad_norm"):
        np.testing.assert_allclose(float(metrics[key]), float(plain_metrics[key]), **F32)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), **F32),
                 state.params, plain_state.params)
    np.testing.assert_array_equal(seconds, np.zeros(SHARDS))  # the stand-in clock reads 0


@pytest.mark.parametrize("flags, refused", [
    ("--xla_gpu_command_buffer_scheduling_mode=CONCURRENT", True),
    ("--xla_dump_to=/tmp/x --xla_gpu_command_buffer_scheduling_mode=concurrent", True),
    ("--xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS", False),
    ("--xla_gpu_command_buffer_scheduling_mode=SERIALIZE", False),
    ("", False)])
def test_device_clock_refuses_concurrent_command_buffers(flags, refused, monkeypatch):
    """Under XLA's concurrent command-buffer scheduling the clock readings need not bracket the
    program (its first kernels may start before the first reading), so clocked() is an error
    there, naming the flag; the other scheduling modes keep the program's order."""
    from pallas_kernels import device_clock
    monkeypatch.setenv("XLA_FLAGS", flags)
    if refused:
        with pytest.raises(ValueError, match="xla_gpu_command_buffer_scheduling_mode"):
            device_clock.clocked(lambda x: x)
    else:
        assert callable(device_clock.clocked(lambda x: x))
