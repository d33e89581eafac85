"""Host-side timing of device work: the measured times the latency table and EMA are built on.

Owns one rule for timing a jitted call: compile and warm up first (never time a compile), block
until every output is ready (JAX dispatch is asynchronous: without blocking, the clock measures
only the launch), repeat, and report the median (robust to a stray slow launch).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax


def time_call(fn: Callable[..., Any], *args, warmup: int = 2, repeats: int = 5) -> float:
    """Median wall seconds of `fn(*args)` with its outputs ready, after `warmup` calls."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    for _ in range(max(warmup, 1)):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
