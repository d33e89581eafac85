"""Kill -9 after a checkpoint, rerun: the resumed losses equal an uninterrupted run's."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sparsebalance_jax.training.metrics import read_metrics
from tests.cpu_flags import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, EVERY = 6, 2
TINY = [
    "--config.attention.block_size=32",
    "--config.data.seq_len=256", "--config.data.max_doc_len=256", "--config.data.min_doc_len=32",
    "--config.data.length_scale=0.01", "--config.data.synthetic_weight=0.0",
    "--config.model.num_layers=2", "--config.model.d_model=64", "--config.model.mlp_dim=128",
    f"--config.train.num_steps={STEPS}", f"--config.train.checkpoint_every={EVERY}",
    "--config.optimizer.warmup_steps=2",
]
# The main job's path (MoBA, SAB, DST with its tuner state in the checkpoint) and the dense one.
MAIN = ["--config.attention.implementation=moba", "--config.balance.dst=True"]
DENSE = ["--config.attention.implementation=reference", "--config.balance.dst=False"]


def _train(workdir, *extra, **popen):
    cmd = [sys.executable, "-m", "experiments.train", "--config=configs/longbench.py:cpu",
           f"--config.train.workdir={workdir}", *TINY, *extra]
    # One persistent compilation cache for a test's runs: the rerun and the resumed run load
    # the first run's executables instead of compiling them again (about a third of the time).
    env = dict(os.environ, XLA_FLAGS=xla_flags(), JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=str(workdir.parent / "jax_cache"))
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _finish(proc, timeout=600) -> str:
    """Waits for a run that must succeed; returns its stdout."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("attention", [MAIN, DENSE], ids=["moba_dst", "dense"])
def test_kill_and_resume_matches_uninterrupted(tmp_path, attention):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _finish(_train(straight, *attention))

    proc = _train(killed, *attention)
    marker = killed / "checkpoints" / str(2 * EVERY)  # a finished checkpoint directory
    deadline = time.time() + 600
    while not marker.exists():
        assert proc.poll() is None, "run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(str(killed))) < STEPS, "the run finished before the kill"

    # It resumed (a restart from scratch would log the same deterministic losses).
    assert f"resumed from step {2 * EVERY}" in _finish(_train(killed, *attention))
    want, got = read_metrics(str(straight)), read_metrics(str(killed))
    assert sorted(want) == sorted(got) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step]["loss"] == want[step]["loss"], step
        budgets = {k: v for k, v in want[step].items() if k.startswith("budget/")}
        assert budgets == {k: got[step][k] for k in budgets}, step


def test_bad_config_stops_the_command_with_one_message(tmp_path):
    """A config the launch refuses ends the command with exit status 2 and the message naming
    the field, no traceback, and nothing written."""
    proc = _train(tmp_path / "run", "--config.attention.budget=99")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().startswith("config error: attention.budget"), err[-2000:]
    assert not (tmp_path / "run").exists()


def test_override_of_a_missing_field_stops_the_command_naming_it(tmp_path):
    """A `--config.` override of a field the config lacks ends the command at flag parsing with
    one message naming the override (and ml_collections' nearest field), exit status 2."""
    proc = _train(tmp_path / "run", "--config.train.num_step=3")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().startswith("config error: train.num_step: the config has no such field")
    assert '"num_steps"' in err, err[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_diverging_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    # Adam's step is ~lr whatever the gradient, so lr=1e30 wrecks the weights at step 1.
    proc = _train(tmp_path / "run", *DENSE, "--config.optimizer.learning_rate=1e30",
                  "--config.optimizer.warmup_steps=0", "--config.train.checkpoint_every=1")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode != 0
    assert "TrainingDivergedError" in err and "at step 2; stopping" in err, err[-2000:]
    assert "the parameters step 2 began with" in err, err[-2000:]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["1"]


@pytest.mark.slow
def test_resume_with_another_config_stops_naming_the_fields(tmp_path):
    """The work directory records its config (run.json); a rerun with a changed field stops
    before restoring, naming it, unless train.resume_with_changes; logging options and remat may
    change."""
    run = tmp_path / "run"
    two = ["--config.train.num_steps=2", "--config.train.checkpoint_every=1",
           "--config.optimizer.warmup_steps=0"]
    _finish(_train(run, *DENSE, *two))
    three = ["--config.train.num_steps=3", "--config.train.checkpoint_every=1",
             "--config.optimizer.warmup_steps=0", "--config.optimizer.learning_rate=0.5",
             "--config.data.batcher=lbb"]
    proc = _train(run, *DENSE, *three)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]  # one message
    assert "train.resume_with_changes" in err and "optimizer.learning_rate" in err \
        and "data.batcher" in err and "train.num_steps: 2 -> 3" in err, err[-2000:]
    assert sorted(read_metrics(str(run))) == [1, 2]  # nothing trained, nothing written
    # Another model shape is refused even with the flag, naming the field, and run.json keeps
    # naming the config that wrote the checkpoints.
    recorded = (run / "run.json").read_bytes()
    proc = _train(run, *DENSE, *three, "--config.train.resume_with_changes=True",
                  "--config.model.num_layers=3")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().startswith("config error: model.num_layers: the checkpoints in"), \
        err[-2000:]
    assert (run / "run.json").read_bytes() == recorded
    # Another batcher cannot take over a window halfway: refused, naming it.
    proc = _train(run, *DENSE, *three, "--config.train.resume_with_changes=True")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "method: 'sab' -> 'lbb'" in err, err[-2000:]
    assert (run / "run.json").read_bytes() == recorded
    three = three[:-1]  # the batcher kept
    _finish(_train(run, *DENSE, *three, "--config.train.resume_with_changes=True",
                   "--config.train.log_every=1"))
    assert sorted(read_metrics(str(run))) == [1, 2, 3]
    # run.json now holds the new config: the same command resumes without the flag, with the
    # layers rematerialised too (that changes what the backward pass recomputes, not the run).
    _finish(_train(run, *DENSE, *three, "--config.model.remat=True",
                   "--config.model.remat_keep=('mlp',)"))


@pytest.mark.slow
def test_cropped_jsonl_records_are_counted_in_the_metrics(tmp_path):
    """Records longer than data.max_doc_len are cropped, and the training metrics count them."""
    path = tmp_path / "long.jsonl"
    with open(path, "w") as f:
        for i in range(8):
            f.write(json.dumps({"messages": [
                {"role": "user", "content": f"record {i}: " + "context " * 80 + "question?"},
                {"role": "assistant", "content": "answer"}]}) + "\n")
    run = tmp_path / "run"
    _finish(_train(run, *DENSE, "--config.train.num_steps=1", "--config.train.checkpoint_every=1",
                   "--config.optimizer.warmup_steps=0", "--config.data.text_weight=0.0",
                   "--config.data.jsonl_weight=1.0", f"--config.data.jsonl_paths=('{path}',)"))
    (row,) = read_metrics(str(run)).values()
    assert row["cropped_docs"] >= 1 and row["cropped_tokens"] >= 400, row
