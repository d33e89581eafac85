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


class _Pending:
  """An output whose work finishes only when waited for (as a dispatched JAX array's)."""

  def __init__(self, seconds):
    self.seconds = seconds

  def block_until_ready(self):
    time.sleep(self.seconds)
    return self


def test_time_call_waits_for_the_outputs_and_takes_the_median():
  # Warm-up 0.04 s, then calls of 0.03, 0.001, 0.03, 0.001, 0.03 s: median 0.03, min 0.001,
  # mean 0.018, and about 0 unless each call is waited for. (A sleep may overrun on a loaded
  # machine, never fall short: hence the loose upper bound.)
  durations = iter([0.04, 0.03, 0.001, 0.03, 0.001, 0.03])
  seconds = time_call(lambda: _Pending(next(durations)), warmup=1, repeats=5)
  assert 0.03 <= seconds < 0.1
