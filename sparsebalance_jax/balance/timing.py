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

from pallas_kernels import device_clock


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


def clocked_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """jit of `device_clock.clocked(fn)`: (*args) -> (fn(*args), the GPU clock read before its
    first kernel and after its last). Build it once per function and time it with
    time_on_device as often as needed: one compile per input shapes, as fn's own."""
    return jax.jit(device_clock.clocked(fn))


def device_samples(clocked: Callable[..., Any], *args, warmup: int = 2, repeats: int = 5,
                   wait: Callable[[Any], Any] = jax.block_until_ready
                   ) -> tuple[list[float], list[float]]:
    """(wall seconds, device seconds) of each of `repeats` synchronised calls of a clocked_call
    `clocked(*args)`, after `warmup` calls; `wait` waits for a call's outputs (the project's
    rule: jax.block_until_ready). The device seconds are the call's span on the GPU's own
    clock: what the GPU spent on it, without the host's work before the first kernel and after
    the last, which a synchronised wall clock adds (on the H200 machine 0.35 ms for a plain
    program of 3 ms, growing with the program's length: BENCHMARKS.md). GPU only."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    for _ in range(max(warmup, 1)):
        wait(clocked(*args))
    walls, spans = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = clocked(*args)
        wait(out)
        walls.append(time.perf_counter() - start)
        clock_2L = out[1]
        spans.append(float(device_clock.elapsed_seconds(clock_2L[0], clock_2L[1],
                                                        at_most_seconds=walls[-1])))
    return walls, spans


def time_on_device(clocked: Callable[..., Any], *args, warmup: int = 2,
                   repeats: int = 5) -> tuple[float, float]:
    """(median wall seconds, median device seconds) of device_samples' synchronised calls."""
    walls, spans = device_samples(clocked, *args, warmup=warmup, repeats=repeats)
    return statistics.median(walls), statistics.median(spans)
