"""Shared pytest setup: CPU by default, GPU-marked tests skipped where no GPU exists."""

import os

from tests.cpu_flags import xla_flags

# Eight host devices let the sharding tests build real meshes on CPU. Must be set
# before JAX initialises its backends, hence here and not in a fixture.
os.environ.setdefault("XLA_FLAGS", xla_flags(8))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

SEED_ENV = "SB_TEST_SEED"


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def pytest_xdist_auto_num_workers(config):
    """Workers for `pytest -n auto`: one per core, at most four (each holds eight host devices
    and its own compiled programs); none on a machine with a GPU, where every process would
    claim most of its memory, so there the tests run in this one process."""
    if os.path.exists("/dev/nvidia0"):
        return 0
    return min(4, len(os.sched_getaffinity(0)))


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _reported_seed(monkeypatch, request):
    """Fresh random inputs each run, and any failing run reproducible: a test's unseeded
    `np.random.default_rng()` calls draw, in call order, from one seed per test, printed
    (pytest shows it beside a failure) and taken from SB_TEST_SEED when that is set."""
    seed = int(os.environ.get(SEED_ENV) or np.random.SeedSequence().entropy % 2**63)
    print(f"seed {seed}; rerun with {SEED_ENV}={seed} python -m pytest '{request.node.nodeid}'")
    root = np.random.SeedSequence(seed)
    fresh = np.random.default_rng

    def default_rng(seed_arg=None):
        return fresh(root.spawn(1)[0] if seed_arg is None else seed_arg)

    monkeypatch.setattr(np.random, "default_rng", default_rng)
