"""Document-length distributions (in tokens) that shape the workload the balancer sees.

Two mimic the datasets the SparseBalance paper trains on, drawn at their real scale (tokens of a
~32K-context model) and then multiplied by `scale`, so a CPU preset with scale 1/32 sees the
same shape at 1/32 of the length:

- ``longalign`` (LongAlign-10k-like long tail): a log-normal (median 15K, sigma 0.55) truncated
  to [8K, 72K]. Quantiles at scale 1 (p10 / p50 / p90 / p99):
  ~9.9K / 16.8K / 32K / 54K; at scale 1/32 (CPU preset): ~310 / 520 / 1000 / 1700, range
  256-2304.
- ``chatqa2`` (ChatQA2-Long-SFT-like bimodal): 70% short, a log-normal (median 1.2K, sigma
  0.8) truncated to [64, 4K]; 30% long, a log-normal (median 24K, sigma 0.45) truncated to
  [16K, 72K]. Quantiles at scale 1 (p10 / p50 / p90 / p99): ~0.5K / 1.7K / 32K / 56K;
  70% fall below 4K, 30% above 16K, nothing in between.
- ``uniform``: integers uniform in [min_len, max_len] (`scale` unused).
- ``fixed``: every document `max_len` long (`scale` unused).

After scaling, lengths are rounded and clipped to [min_len, max_len]. The quantile claims are
checked by tests/test_data_sources.py (test_length_distributions_have_documented_shape).
"""

from __future__ import annotations

import numpy as np

LENGTH_KINDS = ("longalign", "chatqa2", "uniform", "fixed")

_K = 1024
# (median, sigma, low, high) of each truncated log-normal component, in unscaled tokens.
_LONGALIGN = (15 * _K, 0.55, 8 * _K, 72 * _K)
_CHATQA2_SHORT = (1.2 * _K, 0.8, 64, 4 * _K)
_CHATQA2_LONG = (24 * _K, 0.45, 16 * _K, 72 * _K)
_CHATQA2_LONG_FRACTION = 0.3


def _truncated_lognormal(rng: np.random.Generator, n: int, median: float, sigma: float,
                         low: float, high: float) -> np.ndarray:
    """`n` log-normal draws restricted to [low, high] by rejection (deterministic given rng)."""
    out = np.empty(0)
    while out.size < n:
        draw = rng.lognormal(np.log(median), sigma, size=2 * (n - out.size) + 8)
        out = np.concatenate([out, draw[(draw >= low) & (draw <= high)]])
    return out[:n]


def sample_lengths(kind: str, rng: np.random.Generator, n: int, scale: float = 1.0,
                   min_len: int = 1, max_len: int = 72 * _K) -> np.ndarray:
    """`n` document lengths in tokens, int64[n], drawn from distribution `kind` (see module doc)."""
    if kind not in LENGTH_KINDS:
        raise ValueError(f"length distribution {kind!r} unknown; expected one of {LENGTH_KINDS}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len ({min_len}) <= max_len ({max_len})")
    if scale <= 0:
        raise ValueError(f"length scale must be positive, got {scale}")
    if kind == "uniform":
        return rng.integers(min_len, max_len + 1, size=n).astype(np.int64)
    if kind == "fixed":
        return np.full(n, max_len, dtype=np.int64)
    if kind == "longalign":
        raw = _truncated_lognormal(rng, n, *_LONGALIGN)
    else:
        is_long = rng.random(n) < _CHATQA2_LONG_FRACTION
        raw = np.empty(n)
        raw[~is_long] = _truncated_lognormal(rng, int((~is_long).sum()), *_CHATQA2_SHORT)
        raw[is_long] = _truncated_lognormal(rng, int(is_long.sum()), *_CHATQA2_LONG)
    return np.clip(np.rint(raw * scale), min_len, max_len).astype(np.int64)
