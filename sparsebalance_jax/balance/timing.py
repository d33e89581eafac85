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


def time_pipelined(fn: Callable[..., Any], *args, calls: int = 20, repeats: int = 3) -> float:
    """Median over `repeats` of the wall seconds per call of `calls` back-to-back calls of
    `fn(*args)`, waiting once after the last: the device's rate on a stream of calls, as a
    training loop that does not wait per step sees it. Unlike time_call it leaves out the
    per-call dispatch and synchronisation (they overlap the previous call's device work)."""
    if calls < 1 or repeats < 1:
        raise ValueError(f"calls={calls} and repeats={repeats} must be >= 1")
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)  # one device stream: the last call's output is ready last
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)
