"""Bounded compilation: one compiled step per budget bucket (static k_max), counted.

Owns the cache of ahead-of-time compiled step functions keyed by bucket and by the abstract
signature of the arguments (shapes, dtypes, shardings, tree structure), and the compile
counter the trainer logs as a metric. Budgets themselves are runtime data, so a tuner that
only changes budgets within a bucket never compiles; a new bucket compiles once. Keying on the
argument signature too means an unexpected shape change is compiled (and counted) rather than
silently run on a wrongly-shaped executable.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax


def _signature(args: tuple, kwargs: dict) -> tuple:
    leaves, treedef = jax.tree.flatten((args, kwargs))
    specs = tuple((tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None)))
                  if hasattr(x, "shape") else ("static", repr(x)) for x in leaves)
    return treedef, specs


class CompileCache:
    """`cache(bucket, *args, **kwargs)` runs `jitted` compiled for k_max=bucket.

    `jitted` is a `jax.jit` function whose static argument named `static_argname` (default
    "k_max") is the bucket. Buckets outside the configured set are an error: they would
    compile programs the bound does not account for.
    """

    def __init__(self, jitted: Callable, buckets: tuple[int, ...], *,
                 static_argname: str = "k_max"):
        if not hasattr(jitted, "lower"):
            raise TypeError("CompileCache needs a jax.jit-wrapped function (with .lower)")
        self._jitted = jitted
        self.buckets = tuple(buckets)
        self._static_argname = static_argname
        self._compiled: dict[tuple, Any] = {}
        self.compiles = 0

    def compiled(self, bucket: int, *args, **kwargs):
        if bucket not in self.buckets:
            raise ValueError(f"bucket {bucket} is not one of the configured buckets "
                             f"{self.buckets}")
        key = (bucket, _signature(args, kwargs))
        if key not in self._compiled:
            lowered = self._jitted.lower(*args, **kwargs, **{self._static_argname: bucket})
            self._compiled[key] = lowered.compile()
            self.compiles += 1
        return self._compiled[key]

    def prepare(self, bucket: int, *args, **kwargs) -> float:
        """Compiles for these arguments if not yet: seconds spent compiling (0.0 when compiled
        already), for a caller that times the run apart from the compile."""
        start, compiles = time.perf_counter(), self.compiles
        self.compiled(bucket, *args, **kwargs)
        return time.perf_counter() - start if self.compiles > compiles else 0.0

    def __call__(self, bucket: int, *args, **kwargs):
        return self.compiled(bucket, *args, **kwargs)(*args, **kwargs)

    def metrics(self) -> dict[str, int]:
        return {"compiles": self.compiles, "compiled_buckets": len({k[0] for k in self._compiled})}
