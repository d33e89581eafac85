"""Sharded == unsharded on 8 host devices, and per-shard budgets reach their own rows."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sparsebalance_jax.config import MeshConfig
from sparsebalance_jax.model import Transformer, attention_op
from sparsebalance_jax.sharding import AXES, LOGICAL_RULES, make_mesh, rules_without
from sparsebalance_jax.training.launch import CoverageProbe, local_copies
from sparsebalance_jax.training.state import create_train_state
from sparsebalance_jax.training.step import (batch_shardings, compile_train_step,
                                             jit_train_step, mesh_context)
from tests.test_model import packed_inputs, tiny_config

# float32 compute; only the order of reductions differs between meshes.
F32 = dict(rtol=2e-5, atol=2e-6)
MESHES = [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 4, 2), (4, 1, 2)]


def _batch(rng, k_max, micro_batches=2, rows=8, seq_len=64):
    """Packed rows with ragged budgets in [1, k_max] (a budget past k_max makes its row NaN)."""
    tokens, seg, pos = packed_inputs(rng, micro_batches * rows, seq_len, [0, 20, 50])
    shape = (micro_batches, rows, seq_len)
    return dict(inputs=np.asarray(tokens).reshape(shape),
                targets=np.roll(np.asarray(tokens), -1, axis=1).reshape(shape),
                loss_mask=(rng.random(shape) < 0.8).astype(np.float32),
                segment_ids=np.asarray(seg).reshape(shape),
                positions=np.asarray(pos).reshape(shape),
                budgets=rng.integers(1, k_max + 1, (micro_batches, rows)).astype(np.int32))


def _on_mesh(cfg, mesh_shape):
    """cfg on a data x fsdp x tensor mesh of the first devices: (cfg, mesh, model, initial
    state, its shardings)."""
    data, fsdp, tensor = mesh_shape
    mesh = make_mesh(MeshConfig(data, fsdp, tensor), jax.devices()[:data * fsdp * tensor])
    cfg = cfg.__class__(**{**cfg.__dict__, "mesh": MeshConfig(data, fsdp, tensor)})
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    state, shardings = create_train_state(cfg, mesh, model, jax.random.key(0))
    return cfg, mesh, model, state, shardings


def _one_step(cfg, mesh_shape, batch):
    # Adam's first update is lr * g / (|g| + eps): at the default eps it is sign(g) wherever
    # |g| >> eps, and its value on the few gradients near eps follows rounding in the
    # reduction order, which the mesh sets. An eps well above that noise keeps the update a
    # smooth function of the gradient, so that comparing updates compares gradients.
    cfg = cfg.__class__(**{**cfg.__dict__,
                           "optimizer": dataclasses.replace(cfg.optimizer, eps=1e-3)})
    _, mesh, model, state, shardings = _on_mesh(cfg, mesh_shape)
    params0 = jax.tree.map(np.asarray, state.params)
    step = compile_train_step(model, mesh, shardings)
    placed = jax.device_put(batch, batch_shardings(mesh))
    new_state, metrics = step(state, placed)
    update = jax.tree.map(lambda new, old: np.asarray(new) - old, new_state.params, params0)
    return float(metrics["loss"]), float(metrics["grad_norm"]), update


# MoBA (interpret mode) on the meshes that split the heads over `tensor` and the batch over
# both batch axes: its kernels run under shard_map with per-row budgets, there in layers
# rematerialised with their attention results kept (model.remat_keep), the last mesh's layers
# unrolled (model.scan_layers), against the first mesh's step without remat.
@pytest.mark.parametrize("implementation, meshes", [("reference", MESHES),
                                                    ("moba", [MESHES[0], (2, 2, 2), (4, 1, 2)])])
def test_loss_and_update_agree_across_meshes(implementation, meshes):
    cfg = tiny_config(implementation)
    batch = _batch(np.random.default_rng(), cfg.k_max)
    ref_loss, ref_norm, ref_update = _one_step(cfg, meshes[0], batch)
    assert np.isfinite(ref_loss) and np.isfinite(ref_norm)
    assert all(np.abs(u).max() > 0 for u in jax.tree.leaves(ref_update))  # the step moved all
    for mesh_shape in meshes[1:]:
        if implementation == "moba":
            cfg = tiny_config(implementation, remat=True, remat_keep=("attention",),
                              scan_layers=mesh_shape != meshes[-1])
        loss, norm, update = _one_step(cfg, mesh_shape, batch)
        np.testing.assert_allclose(loss, ref_loss, **F32, err_msg=str(mesh_shape))
        np.testing.assert_allclose(norm, ref_norm, **F32, err_msg=str(mesh_shape))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **F32, err_msg=str(mesh_shape)),
                     update, ref_update)


def _all_reduces_in_loops(hlo: str) -> int:
    """How many all-reduce ops the compiled program's while-loop bodies (the micro-batch loop,
    the layer scans) hold."""
    bodies = set(re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", hlo))
    assert bodies, "the micro-batch loop is gone from the program"
    count = 0
    for block in re.split(r"\n(?=\S)", hlo):
        name = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)", block)
        if name and name.group(1) in bodies:
            count += len(re.findall(r"\sall-reduce(?:-start)?\(", block))
    return count


def _compiled_step(mesh_shape, *, partitioned: bool = True, scan_layers: bool = True) -> str:
    """The compiled step's HLO on a mesh; partitioned=False: no mesh given to the step, so
    XLA's SPMD partitioning alone places every collective."""
    cfg, mesh, _, state, shardings = _on_mesh(tiny_config(scan_layers=scan_layers), mesh_shape)
    placed = jax.device_put(_batch(np.random.default_rng(), cfg.k_max, rows=4),
                            batch_shardings(mesh))
    with mesh_context(mesh):
        return jit_train_step(cfg.model, cfg.attention, shardings,
                              mesh if partitioned else None).lower(
            state, placed, k_max=cfg.k_max).compile().as_text()


@pytest.mark.parametrize("fsdp, tensor, scan_layers", [(1, 1, True), (1, 2, True), (2, 1, True),
                                                       (1, 1, False)])
def test_data_parallel_step_all_reduces_over_data_once(fsdp, tensor, scan_layers):
    """With two data shards the gradients are summed over the micro-batches and layers on each
    shard and all-reduced over `data` once, after the loops: the loops hold exactly the
    all-reduces of the same step on one data shard (those over fsdp and tensor; none on one
    device), the layers scanned or unrolled (model.scan_layers). SPMD partitioning alone puts
    more in them (the gradients' over `data`), so the check can fail."""
    step = lambda data, **kw: _compiled_step((data, fsdp, tensor), scan_layers=scan_layers, **kw)
    one_shard = _all_reduces_in_loops(step(1))
    assert _all_reduces_in_loops(step(2)) == one_shard
    assert _all_reduces_in_loops(step(2, partitioned=False)) > one_shard


@pytest.mark.parametrize("mesh_shape", [(1, 4, 2), (2, 2, 2)])
def test_step_moves_no_whole_activation_between_devices(mesh_shape):
    """Collectives carry weights, their gradients and partial sums, never a whole micro-batch's
    [rows, T, E] activations: the embedding lookup once made XLA gather its activations'
    gradient whole across fsdp to scatter it into the embed-sharded table (at 1 x 4 x 2)."""
    cfg = tiny_config()
    rows_TE = rf"f32\[4,{cfg.data.seq_len},{cfg.model.d_model}\]"
    hlo = _compiled_step(mesh_shape)
    moved = re.findall(rf"= {rows_TE}\S* (?:all-gather|all-to-all)\(", hlo)
    assert not moved, moved


def test_mesh_that_does_not_match_devices_fails():
    with pytest.raises(ValueError, match="does not match the 8 available devices"):
        make_mesh(MeshConfig(2, 2, 1))


def test_each_shard_budget_reaches_its_own_rows():
    """Raising one data shard's budget changes MoBA outputs on that shard's rows only."""
    cfg = tiny_config("moba")
    mesh = make_mesh(MeshConfig(4, 1, 2))
    rng = np.random.default_rng()
    b, t, d = 8, 64, 16
    q = jnp.asarray(rng.standard_normal((b, t, 4, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, t, 2, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, t, 2, d)), jnp.float32)
    seg = jnp.ones((b, t), jnp.int32)
    run = jax.jit(lambda *a: attention_op(*a, cfg=cfg.attention, k_max=4))
    base = np.full((b,), 1, np.int32)
    with jax.set_mesh(mesh):
        out0 = np.asarray(run(q, k, v, seg, jnp.asarray(base)))
        for shard in range(4):  # data shard s owns rows 2s, 2s+1
            budgets = base.copy()
            budgets[2 * shard:2 * shard + 2] = 4
            out = np.asarray(run(q, k, v, seg, jnp.asarray(budgets)))
            changed = np.abs(out - out0).reshape(b, -1).max(axis=1) > 0
            assert changed.tolist() == [r // 2 == shard for r in range(b)]


def test_rules_without_manual_axes_drop_them_from_every_rule():
    rules = dict(rules_without({"data"}))
    assert rules["act_batch"] == "fsdp" and rules["heads"] == "tensor" and rules["embed"] == "fsdp"
    assert all(axes is None for _, axes in rules_without(set(AXES)))
    assert [name for name, _ in rules_without({"data"})] == [name for name, _ in LOGICAL_RULES]


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
def test_coverage_probe_runs_on_the_parameters_mesh(mesh_shape):
    """DST's probe with parameters on the step's mesh (fsdp- and tensor-sharded among them)
    runs there, each device probing its own shards, and gives the curve the one-device probe
    gives."""
    cfg = tiny_config("moba")
    cfg = dataclasses.replace(cfg, balance=dataclasses.replace(cfg.balance, probe_stride=4))
    cfg, mesh, model, state, _ = _on_mesh(cfg, mesh_shape)
    shards = mesh_shape[0] * mesh_shape[1]
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, shards * 2, 64, [0, 24])
    batch = {k: np.asarray(x).reshape(shards, 1, 2, 64)
             for k, x in (("inputs", tokens), ("segment_ids", seg), ("positions", pos))}
    probe = CoverageProbe(cfg, model)
    on_mesh = probe(batch, state.params)
    assert on_mesh.sharding.device_set == set(mesh.devices.flat)
    one_device = probe(batch, jax.tree.map(np.asarray, state.params))
    assert len(one_device.sharding.device_set) == 1
    assert on_mesh.shape == (shards, cfg.attention.budget)
    np.testing.assert_allclose(np.asarray(on_mesh), np.asarray(one_device), **F32)
    assert np.ptp(np.asarray(on_mesh)[:, 1]) > 0, "shards of other documents differ in coverage"


def test_local_copies_reuse_the_devices_own_parameter_copies():
    """launch.local_copies (the multi-process DST probe's parameters): replicated parameters
    re-wrapped on a mesh of the process's devices, from the buffers those devices hold."""
    _, mesh, _, state, _ = _on_mesh(tiny_config("moba"), (8, 1, 1))
    local = make_mesh(MeshConfig(8, 1, 1), jax.devices()[::-1])
    copies = local_copies(state.params, local)
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(copies)):
        assert y.sharding.mesh == local and y.sharding.is_fully_replicated
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        pointers = {s.device: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
        assert all(pointers[s.device] == s.data.unsafe_buffer_pointer()
                   for s in y.addressable_shards)


def test_mesh_axes_are_data_fsdp_tensor_in_config_order():
    mesh = make_mesh(MeshConfig(4, 2, 1))
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
    assert mesh.devices.flatten().tolist() == jax.devices()


# How each parameter is split, read off the model's logical names apart from LOGICAL_RULES:
# the model dimension over fsdp; heads, KV heads, MLP columns and the vocabulary over tensor;
# head_dim and the norms whole; never over data. (Axes after the scanned layers' layer axis.)
PARAMETER_SPLITS = {
    "embed/embedding": ("tensor", "fsdp"),
    "q/kernel": ("fsdp", "tensor", None), "q/bias": ("tensor", None),
    "k/kernel": ("fsdp", "tensor", None), "k/bias": ("tensor", None),
    "v/kernel": ("fsdp", "tensor", None), "v/bias": ("tensor", None),
    "o/kernel": ("tensor", None, "fsdp"),
    "gate/kernel": ("fsdp", "tensor"), "up/kernel": ("fsdp", "tensor"),
    "down/kernel": ("tensor", "fsdp"),
    "lm_head/kernel": ("fsdp", "tensor"),
    "scale": (None,),
}


def test_parameters_and_adam_moments_are_born_split_over_fsdp_and_tensor():
    """On a 1 x 4 x 2 mesh every parameter, and Adam's two moments of it, is held split as
    PARAMETER_SPLITS says: each device holds its 1/4 of the model dimension (fsdp) and its 1/2
    of the heads / MLP columns / vocabulary (tensor)."""
    _, mesh, _, state, _ = _on_mesh(tiny_config(), (1, 4, 2))
    sizes = dict(mesh.shape)
    adam = [s for s in jax.tree.leaves(state.opt_state,
                                       is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)]
    assert len(adam) == 1
    checked = set()
    for tree in (state.params, adam[0].mu, adam[0].nu):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            (rule,) = [r for r in PARAMETER_SPLITS if name.endswith(r)]
            axes = ((None,) if name.startswith("layers/") else ()) + PARAMETER_SPLITS[rule]
            assert len(axes) == leaf.ndim, name
            want = tuple(n // (sizes[a] if a else 1) for n, a in zip(leaf.shape, axes))
            shapes = {s.data.shape for s in leaf.addressable_shards}
            assert shapes == {want}, (name, shapes, want)
            checked.add(rule)
    assert checked == set(PARAMETER_SPLITS)
