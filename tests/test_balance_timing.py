"""The two wall-clock rules of balance.timing: one synchronised call (time_call) and a stream
of back-to-back calls (time_pipelined)."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import device_clock
from sparsebalance_jax.balance import timing
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
  # Warm-up 0.04 s, then calls of 0.06, 0.001, 0.03, 0.03, 0.001 s: median 0.03, where the
  # first and largest are 0.06, the last and smallest 0.001, the mean 0.024, and all of them
  # about 0 unless each call is waited for. (A sleep may overrun on a loaded machine, never
  # fall short: hence the upper bound at the next sample up.)
  durations = iter([0.04, 0.06, 0.001, 0.03, 0.03, 0.001])
  seconds = time_call(lambda: _Pending(next(durations)), warmup=1, repeats=5)
  assert 0.03 <= seconds < 0.06


def test_time_on_device_takes_the_median_span_and_restores_wraps():
  """time_on_device on a stand-in clocked call (no GPU: its clock readings are given) whose
  spans read 1000, 2000 and 90000 ns after a warm-up: the median 2000 ns, not the mean. And
  a 5 s program that read 5 - 2^32 ns on the low 32 bits, under a host bound of 8.6 s,
  is 5 s: 5 - 2^32 ns plus the whole wraps the bound leaves room for (one; two would
  make 9.29 s, past the bound)."""
  readings = iter([0, 50, 1000, 2000, 90000])
  clocked = lambda: (np.zeros(2), np.stack([np.zeros(16, np.int32),
                                            np.full(16, next(readings), np.int32)]))
  wall, span = timing.time_on_device(clocked, warmup=2, repeats=3)
  assert span == pytest.approx(2000e-9, rel=1e-12) and 0 < wall < 1
  five = np.full((1, 16), 5_000_000_000 % (1 << 32), np.int64).astype(np.uint32).view(np.int32)
  zero = np.zeros((1, 16), np.int32)
  np.testing.assert_allclose(device_clock.elapsed_seconds(zero, five, at_most_seconds=8.6),
                             [5.0])
