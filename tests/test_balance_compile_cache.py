"""Bounded compilation: 1,000 tuner decisions under random loads compile <= #buckets times."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparsebalance_jax.balance import compile_cache, tuner

BUCKETS = (4, 8, 12, 16)
traces = []


@functools.partial(jax.jit, static_argnames=("k_max",))
def _step(x_B, budget_B, *, k_max):
    traces.append(k_max)  # runs once per real trace/compile, never on a cached call
    # A stand-in for the step: work scales with the runtime budget, shapes with static k_max.
    weights_K = (jnp.arange(k_max)[None, :] < budget_B[:, None]).astype(x_B.dtype)
    return x_B * weights_K.sum(axis=1)


def test_thousand_decisions_compile_at_most_once_per_bucket():
    traces.clear()
    cache = compile_cache.CompileCache(_step, BUCKETS)
    config = tuner.TunerConfig(anchor="mean", p=0.3, coverage_floor=0.0, buckets=BUCKETS)
    rng = np.random.default_rng()
    x_B = jnp.ones(8)
    used = set()
    for _ in range(1000):
        base = int(rng.integers(1, BUCKETS[-1] + 1))
        load_S = rng.lognormal(0.0, 0.7, size=8)
        fn = lambda s, k: float(load_S[s] * (1.0 + k))  # noqa: E731
        budgets_S = tuner.decide(load_S * (1.0 + base), base, None, fn, config)
        bucket = tuner.bucket_for(budgets_S, BUCKETS)
        used.add(bucket)
        out = cache(bucket, x_B, jnp.asarray(budgets_S))
        np.testing.assert_array_equal(np.asarray(out), budgets_S.astype(np.float32))
    assert cache.compiles == len(traces) == len(used) <= len(BUCKETS)
    assert cache.metrics() == {"compiles": len(used), "compiled_buckets": len(used)}


def test_unknown_bucket_rejected_and_shape_change_counted():
    cache = compile_cache.CompileCache(_step, BUCKETS)
    with pytest.raises(ValueError, match="bucket 5"):
        cache(5, jnp.ones(2), jnp.ones(2, jnp.int32))
    cache(8, jnp.ones(2), jnp.ones(2, jnp.int32))
    cache(8, jnp.ones(2), jnp.full(2, 3, jnp.int32))
    assert cache.compiles == 1
    cache(8, jnp.ones(3), jnp.ones(3, jnp.int32))
    assert cache.compiles == 2
