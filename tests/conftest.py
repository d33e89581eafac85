"""Shared pytest setup: CPU by default, GPU-marked tests skipped where no GPU exists."""

import os

from tests.cpu_flags import xla_flags

# Eight host devices let the sharding tests build real meshes on CPU. Must be set
# before JAX initialises its backends, hence here and not in a fixture.
os.environ.setdefault("XLA_FLAGS", xla_flags(8))

import jax  # noqa: E402
import pytest  # noqa: E402


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
