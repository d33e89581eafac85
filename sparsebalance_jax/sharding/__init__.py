"""Device mesh and logical-axis sharding rules."""

from sparsebalance_jax.sharding.mesh import (AXES, BATCH_AXES, LOGICAL_RULES, make_mesh,
                                             rules_without)

__all__ = ["AXES", "BATCH_AXES", "LOGICAL_RULES", "make_mesh", "rules_without"]
