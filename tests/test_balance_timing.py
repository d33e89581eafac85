"""The two wall-clock rules of balance.timing: one synchronised call (time_call) and a stream
of back-to-back calls (time_pipelined)."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparsebalance_jax.balance.timing import time_call, time_pipelined


def _sleepy(seconds):
  """A jitted call whose device work takes at least `seconds` (a host callback sleeping)."""
  def host(x):
    time.sleep(seconds)
    return x

  return jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x))


@pytest.mark.parametrize("rule", [lambda f, x: time_call(f, x, warmup=1, repeats=3),
                                  lambda f, x: time_pipelined(f, x, calls=4, repeats=2)])
def test_per_call_time_covers_the_work(rule):
  """Each rule reports seconds per call: at least the call's 20 ms, and not several calls'."""
  seconds = rule(_sleepy(0.02), jnp.ones((4,), jnp.float32))
  assert 0.02 <= seconds < 0.06


def test_bad_counts_are_errors():
  f, x = jax.jit(lambda x: x + 1), np.ones(3, np.float32)
  with pytest.raises(ValueError, match="calls=0"):
    time_pipelined(f, x, calls=0)
  with pytest.raises(ValueError, match="repeats=0"):
    time_call(f, x, repeats=0)
