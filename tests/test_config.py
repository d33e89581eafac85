"""Invalid configurations fail at start with a message naming the field."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.longbench import get_config
from pallas_kernels.moba.attention import BACKENDS
from sparsebalance_jax.config import (MOBA_BACKENDS, ConfigError, check_attention_runs_here,
                                      from_config_dict, max_layer_budget)
from sparsebalance_jax.training import checkpoint, launch
from sparsebalance_jax.training.state import learning_rate_schedule


def _raw(**changes):
    raw = get_config("cpu")
    for dotted, value in changes.items():
        section, field = dotted.split("__")
        raw[section][field] = value
    return raw


def test_presets_are_valid():
    assert from_config_dict(get_config("cpu"), device_count=2).mesh.data == 2
    gpu = from_config_dict(get_config("gpu"), device_count=1)
    assert (gpu.model.num_layers, gpu.model.d_model, gpu.model.num_heads, gpu.model.num_kv_heads,
            gpu.model.head_dim, gpu.model.mlp_dim, gpu.data.seq_len) == (24, 896, 14, 2, 64, 4864,
                                                                         32768)
    assert gpu.mesh.data == 1  # -1 resolved to the one device


@pytest.mark.parametrize("changes, field", [
    (dict(data__seq_len=1000), "data.seq_len"),
    (dict(attention__budget=17), "attention.budget"),
    (dict(attention__implementation="flash"), "attention.implementation"),
    (dict(attention__moba_backend="cuda"), "attention.moba_backend"),
    (dict(attention__moba_backend="mosaic"), "attention.moba_backend"),  # CPU preset: head_dim 32
    (dict(attention__budget_buckets=(8, 4)), "attention.budget_buckets"),
    (dict(model__num_heads=5), "model.num_heads"),
    (dict(data__batcher="fifo"), "data.batcher"),
    (dict(balance__anchor="median"), "balance.anchor"),
    (dict(balance__probe_stride=0), "balance.probe_stride"),
    (dict(balance__probe_stride=10_000), "balance.probe_stride"),
    (dict(model__vocab_size=256), "model.vocab_size"),
    (dict(mesh__fsdp=3), "mesh.fsdp"),
    (dict(optimizer__warmup_steps=-1), "optimizer.warmup_steps"),
    (dict(train__log_every=0), "train.log_every"),
    (dict(attention__layer_budget_scale=(1.0, 1.0, 1.0, 1.5)), "attention.layer_budget_scale"),
    # With DST off (the preset's DST refuses any scales, naming the same field): a scale per
    # layer, and no layer's scaled budget past the largest bucket (3 x 3.0 = 9 > 8).
    (dict(balance__dst=False, attention__layer_budget_scale=(1.0, 1.0)),
     "attention.layer_budget_scale"),
    (dict(balance__dst=False, attention__layer_budget_scale=(1.0, 1.0, 1.0, 3.0)),
     "attention.layer_budget_scale"),
    (dict(data__max_doc_len=2048), "data.max_doc_len"),  # past data.seq_len (1024)
    (dict(balance__dst=True, attention__implementation="reference"), "balance.dst"),
    (dict(model__num_layers=0), "model.num_layers"),
    (dict(model__num_kv_heads=0), "model.num_kv_heads"),
    (dict(model__head_dim=48), "model.head_dim"),  # MoBA's kernels: a power of two
    (dict(model__remat_keep=("attention", "qkv")), "model.remat_keep"),
    (dict(model__remat_keep=("mlp", "mlp")), "model.remat_keep"),
    (dict(optimizer__grad_clip_norm=0.0), "optimizer.grad_clip_norm"),
    (dict(optimizer__learning_rate=float("nan")), "optimizer.learning_rate"),
    (dict(optimizer__b2=1.0), "optimizer.b2"),
    (dict(optimizer__min_lr_ratio=5.0), "optimizer.min_lr_ratio"),
    (dict(optimizer__eps=0.0), "optimizer.eps"),
    (dict(data__seed=-1), "data.seed"),
    (dict(train__workdir=" "), "train.workdir"),
    (dict(data__jsonl_paths=("/tmp/never_read.jsonl",)), "data.jsonl_weight"),
    (dict(data__seq_len=0), "data.seq_len: 0 must be positive"),  # not blamed on the budget
    (dict(mesh__data=-2), "mesh.data: -2 must be >= 1, or -1"),
])
def test_invalid_field_is_named(changes, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        from_config_dict(_raw(**changes))


def test_missing_jsonl_file_is_named_before_the_pipeline_reads(tmp_path):
    present = tmp_path / "present.jsonl"
    present.write_text('{"input": "q", "output": "a"}\n')
    missing = str(tmp_path / "missing.jsonl")
    cfg = from_config_dict(_raw(data__jsonl_weight=0.5, data__jsonl_paths=(str(present), missing)))
    with pytest.raises(ConfigError, match=rf"^data\.jsonl_paths: no such file: {missing}$"):
        launch.data_spec(cfg)
    ok = from_config_dict(_raw(data__jsonl_weight=0.5, data__jsonl_paths=(str(present),)))
    assert launch.data_spec(ok).jsonl_paths == (str(present),)


def test_mesh_must_match_devices():
    with pytest.raises(ConfigError, match=r"mesh: data x fsdp x tensor = 2x1x1 = 2 does not match "
                                          r"the 8 available devices"):
        from_config_dict(get_config("cpu"), device_count=8)


def test_hopper_kernels_off_hopper_stop_the_run_naming_the_field():
    """The GPU preset's Hopper kernels validate anywhere (validate() reads the config alone);
    the launch check stops a run on a device that cannot run them, naming the field."""
    cfg = from_config_dict(get_config("gpu"), device_count=1)
    assert cfg.attention.moba_backend == "mosaic"
    device = jax.devices()[0]
    if device.platform == "gpu" and str(device.compute_capability).startswith("9"):
        check_attention_runs_here(cfg)  # a Hopper GPU runs them
        return
    with pytest.raises(ConfigError, match=r"attention\.moba_backend: .*Hopper"):
        check_attention_runs_here(cfg)
    check_attention_runs_here(from_config_dict(get_config("cpu"), device_count=2))


def test_attention_a_cpu_cannot_run_stops_the_run_naming_the_field():
    """cuDNN attention, or the Pallas kernels compiled (not interpreted), stop a CPU-only
    process at launch; a GPU process runs both."""
    cases = ((dict(attention__implementation="cudnn", balance__dst=False),
              r"attention\.implementation: 'cudnn'"),
             (dict(attention__interpret=False), r"attention\.interpret: False"))
    for changes, message in cases:
        cfg = from_config_dict(_raw(**changes), device_count=2)
        if jax.devices()[0].platform == "gpu":
            check_attention_runs_here(cfg)
        else:
            with pytest.raises(ConfigError, match=message):
                check_attention_runs_here(cfg)


def test_warmup_may_outlast_the_run():
    """A short run under a longer warm-up validates, and its rate rises to the end, below
    the peak; the first update's rate is a warm-up step's, not 0."""
    cfg = from_config_dict(_raw(train__num_steps=3, optimizer__warmup_steps=10), device_count=2)
    rates = [float(learning_rate_schedule(cfg.optimizer, 3)(i)) for i in range(3)]
    assert rates == sorted(rates) and rates[-1] < cfg.optimizer.learning_rate
    np.testing.assert_allclose(rates, [cfg.optimizer.learning_rate * (i + 1) / 10
                                       for i in range(3)], rtol=1e-6)


def test_moba_backends_are_the_kernel_registry():
    assert MOBA_BACKENDS == tuple(BACKENDS)


def test_unknown_field_is_named():
    raw = get_config("cpu")
    raw.model.num_experts = 4
    with pytest.raises(ConfigError, match=r"model: unknown field\(s\) \['num_experts'\]"):
        from_config_dict(raw)


def test_wrong_type_is_named():
    """A value of the wrong type fails at start naming the field, not inside the run (a
    float budget bucket once failed in the tuner's bucket rule)."""
    raw = get_config("cpu").to_dict()
    raw["attention"]["budget_buckets"] = (4.5, 8)
    with pytest.raises(ConfigError, match=r"attention\.budget_buckets: expected int, got float"):
        from_config_dict(raw)
    raw = get_config("cpu").to_dict()
    raw["model"]["remat"] = 1
    with pytest.raises(ConfigError, match=r"model\.remat: expected bool, got int"):
        from_config_dict(raw)
    raw = get_config("cpu").to_dict()
    raw["optimizer"]["learning_rate"] = 1  # an int where a float is asked: taken as 1.0
    assert from_config_dict(raw, device_count=2).optimizer.learning_rate == 1.0


def test_max_layer_budget_rounds_as_the_model_does():
    """The bucket check and the loop's range check take the model's per-layer budget: its
    float32 round of budget x scale (a float64 product rounds 45 x 0.7 to 31, float32 to 32)."""
    assert max_layer_budget(45, (0.7,)) == 32 and max_layer_budget(1, (0.1,)) == 1
    budgets = jnp.arange(1, 65, dtype=jnp.int32)
    for scale in np.linspace(0.01, 3.99, 400):
        model_B = jnp.maximum(jnp.round(budgets * jnp.float32(scale)), 1).astype(jnp.int32)
        assert [max_layer_budget(int(b), (1.0, float(scale))) for b in budgets] == [
            max(int(m), int(b)) for m, b in zip(model_B, budgets)], scale


def test_k_max_holds_the_largest_scaled_layer_budget():
    """The base configuration's compiled bucket is the smallest holding budget x the largest
    layer scale (3 x 2.0 = 6: bucket 8), not the base budget's (4)."""
    assert from_config_dict(_raw(), device_count=2).k_max == 4
    cfg = from_config_dict(_raw(balance__dst=False,
                                attention__layer_budget_scale=(1.0, 0.5, 1.0, 2.0)),
                           device_count=2)
    assert cfg.k_max == 8


def _with(cfg, section, **changes):
    """cfg with fields of one section (a frozen dataclass) changed."""
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section),
                                                                    **changes)})


# Fields that shape the parameters or the optimizer state, listed here apart from the
# library's PARAMETER_FIELDS: a resume is refused when any changes, whatever the flag says.
SHAPING_CHANGES = dict(vocab_size=512, num_layers=5, d_model=256, num_heads=8, num_kv_heads=4,
                       head_dim=64, mlp_dim=1024, param_dtype="bfloat16")


def test_run_config_refuses_every_change_but_the_resumable_ones(tmp_path):
    """checkpoint.check_run_config against the recorded run.json: a field that shapes the
    parameters is refused even with train.resume_with_changes; any other change (one alone is
    enough: the seeds, the batcher, the learning rate) is refused without the flag and let
    through with it; logging, checkpoint cadence and remat may change freely; a fresh run
    compares nothing."""
    cfg = from_config_dict(get_config("cpu"), device_count=2)
    workdir = str(tmp_path)
    checkpoint.record_run_config(workdir, cfg)
    assert checkpoint.check_run_config(workdir, cfg, resuming=True) == []
    flag = dict(resume_with_changes=True)
    for field, value in SHAPING_CHANGES.items():
        assert getattr(cfg.model, field) != value, field
        changed = _with(_with(cfg, "model", **{field: value}), "train", **flag)
        with pytest.raises(ConfigError, match=rf"^model\.{field}: the checkpoints in"):
            checkpoint.check_run_config(workdir, changed, resuming=True)
        assert checkpoint.check_run_config(workdir, changed, resuming=False) == []
    others = [("data", "seed", cfg.data.seed + 1), ("train", "seed", cfg.train.seed + 1),
              ("data", "batcher", "lbb" if cfg.data.batcher != "lbb" else "sab"),
              ("optimizer", "learning_rate", cfg.optimizer.learning_rate * 2),
              ("data", "jsonl_paths", ("/elsewhere.jsonl",)), ("model", "rope_theta", 123.0)]
    for section, field, value in others:
        changed = _with(cfg, section, **{field: value})
        with pytest.raises(ConfigError, match=rf"^train\.resume_with_changes: .*changed: "
                                              rf"{section}\.{field}: "):
            checkpoint.check_run_config(workdir, changed, resuming=True)
        let_through = checkpoint.check_run_config(workdir, _with(changed, "train", **flag),
                                                  resuming=True)
        assert [c.split(":")[0] for c in let_through] == [f"{section}.{field}"]
    free = _with(_with(cfg, "train", log_every=cfg.train.log_every + 1,
                       checkpoint_every=cfg.train.checkpoint_every + 1),
                 "model", remat=not cfg.model.remat, scan_layers=not cfg.model.scan_layers)
    assert checkpoint.check_run_config(workdir, free, resuming=True) == []
