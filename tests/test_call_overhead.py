"""experiments/call_overhead.py's kernels do the work its table assumes (each adds one), in
interpret mode on the CPU."""

import jax.numpy as jnp
import numpy as np

from experiments.call_overhead import mosaic_add_one, triton_add_one, xla_add_one


def test_each_kind_of_kernel_adds_one():
  x = jnp.asarray(np.random.default_rng().standard_normal((128, 128)), jnp.float32)
  np.testing.assert_allclose(mosaic_add_one(x, interpret=True), x + 1.0, rtol=1e-6)
  np.testing.assert_allclose(triton_add_one(x, interpret=True), x + 1.0, rtol=1e-6)
  np.testing.assert_allclose(xla_add_one(x), jnp.sin(x) + 1.0, rtol=1e-6)
