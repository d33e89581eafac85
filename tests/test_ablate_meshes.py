"""Mesh ablation: mesh parsing and validation, and a two-mesh run that writes its tables."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs.longbench import get_config
from sparsebalance_jax.config import ConfigError, MeshConfig, from_config_dict
from sparsebalance_jax.sharding import ablation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# float32 compute; meshes differ only in how the cross-device sums are ordered.
F32 = dict(rtol=2e-5, atol=2e-6)


def _tiny_raw():
    raw = get_config("cpu")
    raw.attention.implementation = "reference"
    raw.attention.block_size = 32
    raw.balance.dst = False
    raw.data.seq_len = 128
    raw.attention.budget_buckets = (4,)
    raw.data.min_doc_len, raw.data.max_doc_len = 16, 128
    raw.data.rows_per_micro_batch = 1
    raw.model.num_layers, raw.model.d_model, raw.model.mlp_dim = 1, 32, 64
    raw.model.head_dim = 8
    raw.model.compute_dtype = "float32"
    return raw


def test_parse_meshes():
    assert ablation.parse_meshes("1x1x8, 2X2x2,") == (MeshConfig(1, 1, 8), MeshConfig(2, 2, 2))
    for bad in ("2x2", "0x2x4", "2x-1x4", "axbxc", ""):
        with pytest.raises(ValueError, match="--meshes"):
            ablation.parse_meshes(bad)


def test_meshes_are_checked_before_any_run():
    raw = _tiny_raw().to_dict()
    with pytest.raises(ConfigError, match="same number of devices"):
        ablation.check_meshes(raw, ablation.parse_meshes("2x1x1,2x2x1"))
    # Two KV heads cannot be split over 4 tensor shards; the message names the mesh and field.
    with pytest.raises(ConfigError, match=r"mesh 1x1x4: mesh.tensor"):
        ablation.check_meshes(raw, ablation.parse_meshes("4x1x1,1x1x4"))
    assert ablation.check_meshes(raw, ablation.parse_meshes("4x1x1,2x1x2")) == 4


def test_config_mesh_is_the_default():
    raw = _tiny_raw()
    assert ablation.meshes_to_run(None, raw) == (MeshConfig(2, 1, 1),)
    raw.mesh.data = -1
    with pytest.raises(ConfigError, match="-1 axis"):
        ablation.meshes_to_run(None, raw)


def test_synthetic_batch_packs_whole_rows():
    cfg = from_config_dict(_tiny_raw())
    batch = ablation.synthetic_batch(cfg, global_rows=3, seed=np.random.default_rng().integers(99))
    seg_MGT, pos_MGT = batch["segment_ids"], batch["positions"]
    assert seg_MGT.shape == (cfg.data.micro_batches, 3, cfg.data.seq_len)
    assert batch["budgets"].shape == (cfg.data.micro_batches, 3)
    # As training packs: documents 1, 2, ... from block starts, padding (0) only between
    # them, positions restarting at each start, targets the next token within a document.
    block = cfg.attention.block_size
    for row_seg, row_pos, inputs, targets, mask in zip(
            seg_MGT.reshape(-1, cfg.data.seq_len), pos_MGT.reshape(-1, cfg.data.seq_len),
            batch["inputs"].reshape(-1, cfg.data.seq_len),
            batch["targets"].reshape(-1, cfg.data.seq_len),
            batch["loss_mask"].reshape(-1, cfg.data.seq_len)):
        ids = row_seg[row_seg > 0]
        assert ids[0] == 1 and (np.diff(ids) >= 0).all() and (np.diff(ids) <= 1).all()
        starts = np.flatnonzero(np.diff(np.concatenate([[0], row_seg])) > 0)
        assert (starts % block == 0).all() and (row_pos[starts] == 0).all()
        inside = (row_seg[1:] == row_seg[:-1]) & (row_seg[1:] > 0)
        assert (row_pos[1:][inside] == row_pos[:-1][inside] + 1).all()
        assert (targets[:-1][inside] == inputs[1:][inside]).all()  # within a document
        assert ((mask > 0) == (row_seg > 0)).all()


def test_two_meshes_run_and_write_tables(tmp_path):
    raw = _tiny_raw()
    results = ablation.run_ablation(raw, ablation.parse_meshes("2x1x1,1x1x2"), steps=2, warmup=0,
                                    progress=lambda row: None)
    assert [r.mesh for r in results] == ["2x1x1", "1x1x2"]
    for r in results:
        assert len(r.step_times_s) == 2 and r.step_time_s > 0 and r.compile_s > 0
        assert r.tokens_per_step == raw.data.micro_batches * 2 * raw.data.seq_len
        assert r.peak_bytes_per_device is None  # CPU reports no memory statistics.
    # Same batch, same init: the first step's loss does not depend on the mesh.
    np.testing.assert_allclose(results[1].first_loss, results[0].first_loss, **F32)

    md, js = ablation.write_results(str(tmp_path), results, {"steps": 2}, "Mesh ablation (CPU)")
    table = open(md).read()
    assert "| 2x1x1 |" in table and "| 1x1x2 |" in table and "| n/a |" in table
    data = json.load(open(js))
    assert data["steps"] == 2 and [r["mesh"] for r in data["results"]] == ["2x1x1", "1x1x2"]


def test_script_rejects_a_bad_mesh_before_starting_jax():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.ablate_meshes", "--config=configs/longbench.py:cpu",
         "--meshes=2x2x2,2x2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "'2x2' is not DATAxFSDPxTENSOR" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr  # the message alone
