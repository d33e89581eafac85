"""Two local CPU processes train one model together and agree with a single-process run.

Each process runs `experiments.train` with 2 host devices; the processes find each other
through a coordinator on 127.0.0.1 (JAX's CPU multi-process backend, gloo collectives). Dense:
the 4-device mesh (data 2 x fsdp 2) spans both processes, so process p feeds data shards 2p,
2p+1 and holds half of every fsdp-sharded parameter. MoBA + DST: data 4, and the tuner's
per-shard inputs (document lengths, gate coverage) are all-gathered so that both processes
choose the same budgets for all four shards. Each run is compared against one process that has
all 4 devices and the same mesh.
"""

import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from sparsebalance_jax.sharding import distributed
from sparsebalance_jax.training.metrics import read_metrics
from tests.cpu_flags import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4
TINY = [
    "--config.attention.implementation=reference", "--config.attention.block_size=32",
    "--config.data.batcher=lbb",
    "--config.data.seq_len=256", "--config.data.max_doc_len=256", "--config.data.min_doc_len=32",
    "--config.data.length_scale=0.01", "--config.data.synthetic_weight=0.0",
    "--config.data.rows_per_micro_batch=1",
    "--config.model.num_layers=2", "--config.model.d_model=64", "--config.model.mlp_dim=128",
    "--config.model.compute_dtype=float32",
    f"--config.train.num_steps={STEPS}", f"--config.train.checkpoint_every={STEPS}",
    "--config.optimizer.warmup_steps=2",
]
DENSE = ["--config.mesh.data=-1", "--config.mesh.fsdp=2", "--config.balance.dst=False"]
# Budget 2 of 8 blocks with p = 0.3 lets DST move a shard by one block either way (bucket 4
# holds the raise).
MOBA_DST = ["--config.attention.implementation=moba", "--config.mesh.data=-1",
            "--config.mesh.fsdp=1", "--config.balance.dst=True", "--config.attention.budget=2",
            "--config.attention.budget_buckets=(4,)", "--config.balance.dead_band=0.0"]
# float32 compute; the two runs differ only in how the cross-device sums are ordered.
F32 = dict(rtol=2e-5, atol=2e-6)
LOSS_IN_BAR = re.compile(r"loss=([0-9.]+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(workdir, devices: int, flags, **env):
    cmd = [sys.executable, "-m", "experiments.train", "--config=configs/longbench.py:cpu",
           f"--config.train.workdir={workdir}", *TINY, *flags]
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices),
               JAX_PLATFORMS="cpu", **env)
    for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
                 distributed.ENV_PROCESS_ID, distributed.ENV_MODE):
        if name not in env or not env[name]:
            env.pop(name, None)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=300) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, (out + err)[-3000:]
    return out + err


def _two_processes(workdir, flags) -> list[str]:
    port = _free_port()
    procs = [_train(workdir, 2, flags, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                    JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid)) for pid in range(2)]
    try:
        return [_finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize("flags", [DENSE, MOBA_DST], ids=["dense_fsdp", "moba_dst"])
def test_two_processes_match_one(tmp_path, flags):
    single, multi = tmp_path / "single", tmp_path / "multi"
    solo = _train(single, 4, flags)
    logs = _two_processes(multi, flags)
    _finish(solo)

    assert "(4 devices)" in logs[0] and "(4 devices)" in logs[1]
    final = [LOSS_IN_BAR.findall(log)[-1] for log in logs]
    want, got = read_metrics(str(single)), read_metrics(str(multi))
    assert sorted(want) == sorted(got) == list(range(1, STEPS + 1))
    # Both processes report the same final loss, the one the job logged.
    assert final[0] == final[1] == f"{got[STEPS]['loss']:.3f}", final
    for step in want:
        for key in ("loss", "grad_norm", "trained_tokens"):
            np.testing.assert_allclose(got[step][key], want[step][key], **F32,
                                       err_msg=f"step {step} {key}")
        # Document tokens per second count every process's shards: the same tokens per step.
        tokens = [m[step]["tokens_per_s"] * m[step]["step_time_s"] for m in (want, got)]
        np.testing.assert_allclose(tokens[1], tokens[0], rtol=1e-9, err_msg=f"step {step}")
        assert 0 < tokens[0] <= want[step]["row_tokens_per_s"] * want[step]["step_time_s"]
    if flags is MOBA_DST:  # every shard's budget logged, identical in both runs, some moved
        for step in want:
            keys = [f"budget/shard{i}" for i in range(4)]
            assert [got[step][k] for k in keys] == [want[step][k] for k in keys], step
        assert any(got[s][f"budget/shard{i}"] != 2 for s in got for i in range(4))
        return
    # The collective checkpoint restores on both processes: a rerun resumes at the end.
    for log in _two_processes(multi, flags):
        assert f"resumed from step {STEPS}" in log


@pytest.mark.parametrize("env, message", [
    ({"JAX_NUM_PROCESSES": "2"}, "unset while"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     r"must lie in \[0"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     "not an integer"),
    ({"SPARSEBALANCE_DISTRIBUTED": "yes"}, "expected one of"),
])
def test_bad_environment_fails_with_the_variable_named(env, message):
    with pytest.raises(ValueError, match=message):
        distributed.spec_from_env(env)


def test_environment_to_spec():
    assert distributed.spec_from_env({}) is None
    assert distributed.spec_from_env({"SPARSEBALANCE_DISTRIBUTED": "off",
                                      "JAX_NUM_PROCESSES": "2"}) is None
    explicit = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
                "JAX_PROCESS_ID": "3"}
    assert distributed.spec_from_env(explicit) == distributed.DistributedSpec(
        "10.0.0.1:1234", 4, 3, auto_detect=False)
    assert distributed.spec_from_env({"SPARSEBALANCE_DISTRIBUTED": "auto"}) == \
        distributed.DistributedSpec(None, None, None, auto_detect=True)


def test_host_devices_follow_the_launch_the_environment_asks_for(monkeypatch):
    """A fixed mesh asks each process for its share of host devices: all of them when the
    environment asks for one process (no variables, or SPARSEBALANCE_DISTRIBUTED=off whatever
    else is set), half under two; bad variables are a ConfigError naming them."""
    from sparsebalance_jax.config import ConfigError
    from sparsebalance_jax.training import launch

    asked = []
    monkeypatch.setattr(launch.jax.config, "update", lambda name, value: asked.append(value))
    raw = {"mesh": {"data": 2, "fsdp": 2, "tensor": 1}}
    two = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}
    for env, want in (({}, 4), ({"SPARSEBALANCE_DISTRIBUTED": "off", **two}, 4), (two, 2)):
        for name in ("SPARSEBALANCE_DISTRIBUTED", *two):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        asked.clear()
        launch.request_host_devices(raw)
        assert asked == [want], env
    monkeypatch.setenv("JAX_NUM_PROCESSES", "abc")
    with pytest.raises(ConfigError, match="JAX_NUM_PROCESSES='abc' is not an integer"):
        launch.request_host_devices(raw)
