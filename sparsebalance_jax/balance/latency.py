"""Latency models: predicted forward+backward time of a packed micro-batch at a MoBA budget.

Owns the one interface the batchers and the tuner use to price work before running it, its two
implementations, and the online per-shard correction.

How documents combine (both implementations). A packed micro-batch of R rows x T tokens holding
documents of lengths n_1..n_D costs

    predict = call_seconds + sum_d doc_seconds(n_d, k) + pad_seconds_per_token * (R*T - sum_d n_d)

`doc_seconds(n, k)` is what one document adds to the call (its dense layers plus its own MoBA
attention: documents never attend across a boundary, so attention is per document and adds
up); the dense layers also run over padding, priced per padding token; `call_seconds` is the
call's fixed part (launch, synchronisation), paid once per micro-batch however many documents
it packs. The padding and call terms are the same for every layout with the same document
tokens, so they change imbalance ratios (every shard pays them) but not which assignment is
best.

- `AnalyticLatencyModel`: FLOP counts from the layer shape at assumed throughputs. Attention
  work of a document with nb = ceil(n / block) blocks is, per query block i, min(k, i + 1)
  key blocks (top-(k-1) earlier blocks plus its own), plus gate scoring of the i earlier blocks.
- `ProfiledLatencyModel`: a table of measured times of one layer on a row holding one
  document of n tokens at budget k, and on rows of padding only, on one device and layer shape
  (made by `python -m experiments.profile_latency`; one JSON file per device kind and layer
  shape, the attention's kernels included, in a tables folder), bilinear interpolation in
  (length, budget). The padding rows' times, linear in the length, give the call's fixed part
  (their intercept) and the padding's per-token cost (their slope); a document's
  `doc_seconds` is its row's time less the fixed part.
- `EmaCorrection`: per shard, an EMA of measured / predicted ratios that scales predictions
  (FLOP counts and even tables drift from the real step: launch overheads, the collective,
  thermal state), with a checkpointable state dict.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
from typing import Any, Mapping

import numpy as np

from sparsebalance_jax.jsonfile import write_json

PROFILE_COMMAND = "python -m experiments.profile_latency --config=configs/longbench.py"


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """The shape of one decoder layer and the attention kernels it runs: what a latency table
    is keyed by (with the device). The analytic model reads only the shape."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    block_size: int
    kernels: str = "moba_triton"  # The attention's kernels: moba_<backend>, cudnn, reference.

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if field.name != "kernels" and getattr(self, field.name) <= 0:
                raise ValueError(f"LayerShape.{field.name} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LayerShape.num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if not self.kernels.isidentifier():
            raise ValueError(f"LayerShape.kernels={self.kernels!r} is not a name")

    @classmethod
    def from_configs(cls, model_cfg: Any, attention_cfg: Any) -> LayerShape:
        """From any objects with the model and attention configs' field names
        (`sparsebalance_jax.config`)."""
        kernels = (f"moba_{attention_cfg.moba_backend}" if attention_cfg.implementation == "moba"
                   else attention_cfg.implementation)
        return cls(d_model=model_cfg.d_model, num_heads=model_cfg.num_heads,
                   num_kv_heads=model_cfg.num_kv_heads, head_dim=model_cfg.head_dim,
                   mlp_dim=model_cfg.mlp_dim, block_size=attention_cfg.block_size,
                   kernels=kernels)

    def key(self) -> str:
        return (f"d{self.d_model}_h{self.num_heads}_kv{self.num_kv_heads}_hd{self.head_dim}"
                f"_mlp{self.mlp_dim}_blk{self.block_size}_{self.kernels}")


def num_blocks(lengths_N: np.ndarray, block_size: int) -> np.ndarray:
    return -(-np.asarray(lengths_N, dtype=np.int64) // block_size)


def attended_blocks(lengths_N: np.ndarray, budget_N: np.ndarray | int,
                    block_size: int) -> np.ndarray:
    """sum over query blocks i of min(k, i + 1): (query block, key block) pairs attended."""
    nb_N = num_blocks(lengths_N, block_size)
    k_N = np.minimum(np.asarray(budget_N, dtype=np.int64), nb_N)
    # Blocks 0..k-1 see i+1 <= k blocks (a triangle); every later block sees exactly k.
    return k_N * (k_N + 1) // 2 + (nb_N - k_N) * k_N


def gated_blocks(lengths_N: np.ndarray, block_size: int) -> np.ndarray:
    """sum over query blocks i of i: (query block, earlier key block) gate scores computed."""
    nb_N = num_blocks(lengths_N, block_size)
    return nb_N * (nb_N - 1) // 2


def _digest(numbers: Mapping[str, Any]) -> str:
    """12 hex digits of the SHA-256 of `numbers` as sorted JSON (floats in repr: exact)."""
    text = json.dumps(numbers, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class LatencyModel(abc.ABC):
    """Predicted forward+backward seconds of one layer; see the module docstring."""

    block_size: int
    pad_seconds_per_token: float
    call_seconds: float = 0.0  # Paid once per micro-batch (a call), not per document.

    @abc.abstractmethod
    def doc_seconds(self, lengths_N: np.ndarray, budget: np.ndarray | int) -> np.ndarray:
        """Seconds each document adds to a call at its budget -> float64; the budget broadcasts
        against the lengths (scalar or [N] -> [N]; [K, 1] -> [K, N], every document at each of
        K budgets)."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A short digest of every number the predictions depend on: a batcher's saved state
        records it, since a window planned with other numbers is another plan."""

    def predict(self, doc_lengths: np.ndarray, budget: int, *,
                padded_tokens: int | None = None) -> float:
        """Seconds of one packed micro-batch; `padded_tokens` = R*T adds the padding term."""
        lengths_N = np.asarray(doc_lengths, dtype=np.int64)
        lengths_N = lengths_N[lengths_N > 0]
        seconds = self.call_seconds + float(self.doc_seconds(lengths_N, budget).sum())
        return seconds + float(np.sum(self._padding_seconds(lengths_N[None], padded_tokens)))

    def predict_batch(self, doc_lengths_BD: np.ndarray, budget_B: np.ndarray | int, *,
                      padded_tokens: int | None = None) -> np.ndarray:
        """Vectorised `predict` over micro-batches; zero lengths are padding entries."""
        lengths_BD = np.asarray(doc_lengths_BD, dtype=np.int64)
        budget = np.asarray(budget_B, dtype=np.int64)
        budget_BD = np.broadcast_to(budget.reshape(budget.shape + (1,)), lengths_BD.shape)
        present = lengths_BD > 0
        seconds_BD = np.zeros(lengths_BD.shape, dtype=np.float64)
        seconds_BD[present] = self.doc_seconds(lengths_BD[present], budget_BD[present])
        return (seconds_BD.sum(axis=-1) + self._padding_seconds(lengths_BD, padded_tokens)
                + self.call_seconds)

    def predict_per_budget(self, doc_lengths_BD: np.ndarray, budgets_K: np.ndarray, *,
                           padded_tokens: int | None = None) -> np.ndarray:
        """`predict_batch` of every micro-batch at each of K budgets -> float64 [K, B].

        The tuner prices every candidate budget each step: pricing the documents once against
        all K budgets (`doc_seconds` broadcasting) skips the K-fold copy of the lengths and
        their table lookups. Same values as `predict_batch`, bit for bit: the same elementwise
        operations, and the same [.., D] rows summed.
        """
        lengths_BD = np.asarray(doc_lengths_BD, dtype=np.int64)
        budgets_K1 = np.asarray(budgets_K, dtype=np.int64)[:, None]
        present_BD = lengths_BD > 0
        seconds_KBD = np.zeros((len(budgets_K1),) + lengths_BD.shape, dtype=np.float64)
        seconds_KBD[:, present_BD] = self.doc_seconds(lengths_BD[present_BD], budgets_K1)
        return (seconds_KBD.sum(axis=-1) + self._padding_seconds(lengths_BD, padded_tokens)
                + self.call_seconds)

    def _padding_seconds(self, lengths_BD: np.ndarray,
                         padded_tokens: int | None) -> np.ndarray | float:
        """The dense layers' time over each micro-batch's padding [B] (0 without padded_tokens)."""
        if padded_tokens is None:
            return 0.0
        pad_B = padded_tokens - lengths_BD.sum(axis=-1)
        if np.any(pad_B < 0):
            raise ValueError(f"a micro-batch holds {int(lengths_BD.sum(axis=-1).max())} "
                             f"tokens, more than padded_tokens={padded_tokens}")
        return pad_B * self.pad_seconds_per_token


class AnalyticLatencyModel(LatencyModel):
    """FLOP-count model at assumed sustained throughputs (defaults: rough H200 bf16 figures).

    Useful attention FLOPs follow DESIGN.md: 4 * head_dim per (query, key) pair forward, 2.5x
    that backward; a block pair is block_size^2 pairs (the causal own block counted whole: the
    kernel computes it whole). Gate scoring is 2 * head_dim per (query, earlier block), forward
    only (top-k selection passes no gradient). Dense: QKV/O projections and a gated MLP, 2 FLOPs
    per MAC, backward 2x forward.
    """

    def __init__(self, shape: LayerShape, *, dense_flops_per_s: float = 4.0e14,
                 attention_flops_per_s: float = 2.5e14, padding_is_free: bool = False):
        if dense_flops_per_s <= 0 or attention_flops_per_s <= 0:
            raise ValueError("throughputs must be positive")
        self.shape = shape
        self.block_size = shape.block_size
        s = shape
        q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        dense_macs = (s.d_model * (q_dim + 2 * kv_dim) + q_dim * s.d_model
                      + 3 * s.d_model * s.mlp_dim)
        self.seconds_per_token = 3.0 * 2.0 * dense_macs / dense_flops_per_s
        pair_flops = 4.0 * s.head_dim * s.num_heads * 3.5
        self.seconds_per_block_pair = pair_flops * s.block_size**2 / attention_flops_per_s
        gate_flops = 2.0 * s.head_dim * s.num_heads * s.block_size
        self.seconds_per_gate_block = gate_flops / attention_flops_per_s
        # Fixed-shape steps run the dense layers over padding too; `padding_is_free` models a
        # variable-length step (only document tokens cost), for comparison with such systems.
        self.pad_seconds_per_token = 0.0 if padding_is_free else self.seconds_per_token

    def fingerprint(self) -> str:
        return _digest(dict(block_size=self.block_size, seconds_per_token=self.seconds_per_token,
                            seconds_per_block_pair=self.seconds_per_block_pair,
                            seconds_per_gate_block=self.seconds_per_gate_block,
                            pad_seconds_per_token=self.pad_seconds_per_token))

    def doc_seconds(self, lengths_N, budget):
        lengths_N = np.asarray(lengths_N, dtype=np.int64)
        return (lengths_N * self.seconds_per_token
                + attended_blocks(lengths_N, budget, self.block_size) * self.seconds_per_block_pair
                + gated_blocks(lengths_N, self.block_size) * self.seconds_per_gate_block)


@dataclasses.dataclass(frozen=True)
class LatencyTable:
    """Measured seconds of one layer on a row holding one document of exactly that length, and
    on a row of padding only.

    seconds_LK[i, j] is the time at lengths[i] and budgets[j] (both strictly increasing);
    pad_seconds_L[i] the time of a padding-only row of lengths[i]. A line through the padding
    rows' times (least squares) gives `call_seconds`, its intercept clipped to [0, the fastest
    entry] - the fixed part of a call, which a packed micro-batch pays once, not once per
    document - and `pad_seconds_per_token`, its slope. The fields hold the measurements as
    timed (and are what to_json_dict writes); `fitted_seconds_LK`, what the profiled model
    interpolates, is each length's row made non-decreasing in the budget (`_non_decreasing`): a
    larger budget never does less work (a query attends to min(k, its blocks) blocks), so a dip
    is timing noise, and the tuner's scans rely on latency not falling as k rises (`tuner`,
    rule 2); then each budget's column is carried at its running maximum over lengths (a longer
    document never does less work either; the maximum of non-decreasing rows is one, so both
    hold).
    """

    device_kind: str
    shape: LayerShape
    lengths: tuple[int, ...]
    budgets: tuple[int, ...]
    seconds_LK: tuple[tuple[float, ...], ...]
    pad_seconds_L: tuple[float, ...]

    def __post_init__(self):
        if list(self.lengths) != sorted(set(self.lengths)) or self.lengths[0] <= 0:
            raise ValueError(f"table lengths {self.lengths} must be positive, strictly increasing")
        if list(self.budgets) != sorted(set(self.budgets)) or self.budgets[0] < 1:
            raise ValueError(f"table budgets {self.budgets} must be >= 1, strictly increasing")
        arr = np.asarray(self.seconds_LK, dtype=np.float64)
        if arr.shape != (len(self.lengths), len(self.budgets)) or not np.all(arr > 0):
            raise ValueError(f"table seconds must be positive, shape "
                             f"{(len(self.lengths), len(self.budgets))}, got {arr.shape}")
        object.__setattr__(self, "seconds_LK", tuple(tuple(float(x) for x in row) for row in arr))
        fitted_LK = np.maximum.accumulate(
            np.array([_non_decreasing(row) for row in arr]), axis=0)
        fitted = tuple(tuple(float(x) for x in row) for row in fitted_LK)
        object.__setattr__(self, "fitted_seconds_LK", fitted)
        pad_L = np.asarray(self.pad_seconds_L, dtype=np.float64)
        if pad_L.shape != (len(self.lengths),) or not np.all(pad_L > 0):
            raise ValueError(f"table pad_seconds_L must be positive, one per length "
                             f"({len(self.lengths)}), got {pad_L.shape}")
        lengths_L = np.asarray(self.lengths, dtype=np.float64)
        if len(lengths_L) > 1:
            slope, intercept = np.polyfit(lengths_L, pad_L, 1)
        else:
            slope, intercept = pad_L[0] / lengths_L[0], 0.0
        call = float(np.clip(intercept, 0.0, min(np.min(fitted), pad_L.min())))
        # Derived, not fields: to_json_dict writes the measurements only.
        object.__setattr__(self, "call_seconds", call)
        object.__setattr__(self, "pad_seconds_per_token", float(max(slope, 0.0)))

    def to_json_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = dataclasses.asdict(self.shape)
        return d

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> LatencyTable:
        if "pad_seconds_L" not in d:
            raise ValueError("the latency table was profiled before padding rows were timed at "
                             "every length, so a call's fixed part cannot be told from a "
                             f"document's time; profile it again (`{PROFILE_COMMAND}`)")
        return cls(device_kind=d["device_kind"], shape=LayerShape(**d["shape"]),
                   lengths=tuple(int(x) for x in d["lengths"]),
                   budgets=tuple(int(x) for x in d["budgets"]),
                   seconds_LK=tuple(tuple(float(x) for x in row) for row in d["seconds_LK"]),
                   pad_seconds_L=tuple(float(x) for x in d["pad_seconds_L"]))


def _non_decreasing(row: np.ndarray) -> tuple[float, ...]:
    """The least-squares non-decreasing fit of `row` (pool adjacent violators): a run of
    entries that falls is replaced by its mean. Unlike a running maximum it does not carry one
    high reading (a length's first timed budget tends to be one) over every larger budget; a
    row already non-decreasing is returned unchanged, and a pooled run holds one exact value."""
    runs: list[list[float]] = []  # [sum, count] of each pooled run
    for x in row.tolist():
        runs.append([x, 1])
        while len(runs) > 1 and runs[-2][0] / runs[-2][1] > runs[-1][0] / runs[-1][1]:
            total, count = runs.pop()
            runs[-1][0] += total
            runs[-1][1] += count
    return tuple(total / count for total, count in runs for _ in range(count))


def table_path(table_dir: str, device_kind: str, shape: LayerShape) -> str:
    """One JSON file per (device kind, layer shape) in the tables folder."""
    device = "".join(c if c.isalnum() else "_" for c in device_kind)
    return os.path.join(table_dir, f"{device}__{shape.key()}.json")


def save_table(table_dir: str, table: LatencyTable) -> str:
    path = table_path(table_dir, table.device_kind, table.shape)
    os.makedirs(table_dir, exist_ok=True)
    write_json(path, table.to_json_dict(), indent=1)
    return path


def load_table(table_dir: str, device_kind: str, shape: LayerShape) -> LatencyTable:
    path = table_path(table_dir, device_kind, shape)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"no latency table {path!r} for device {device_kind!r} and layer shape "
            f"{shape.key()}; make it on that device with `{PROFILE_COMMAND}` (or use the "
            "analytic latency model)")
    with open(path) as f:
        table = LatencyTable.from_json_dict(json.load(f))
    if table.device_kind != device_kind or table.shape != shape:
        raise ValueError(f"{path!r} holds a table for {table.device_kind!r} / "
                         f"{table.shape.key()}, not {device_kind!r} / {shape.key()}")
    return table


def _bracket(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left index and weight of x in a sorted grid; beyond the ends, the end segment extends."""
    # Searching the interior points gives the segment index already clamped to [0, len - 2].
    i = np.searchsorted(grid[1:-1], x, side="right")
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    return i, w


class ProfiledLatencyModel(LatencyModel):
    """Bilinear interpolation of a measured table, less the table's per-call part.

    A document's `doc_seconds` is its row's interpolated time minus `call_seconds` (the table's
    fixed part of a call), which `predict` adds back once per micro-batch. In length: a
    zero-length document adds nothing (a point added at n = 0), and past the longest profiled
    length the last segment extends linearly (its slopes made non-decreasing in the budget,
    `__init__`). That holds only where the whole segment lies
    past the causal triangle: from k - 1 blocks on every further query block attends to
    exactly k blocks (the blocks attended rise by k a block), so the segment's slope is MoBA
    attention's per-token cost only if its start, lengths[-2], is at least (k - 1) x
    block_size. A document longer than the table at a budget k whose last segment starts
    earlier is an error naming the table file and the command to profile the lengths needed.
    (The gate's scores, quadratic in length, are extended linearly too: by the analytic model's
    FLOP counts 0.15% of a layer's time at 64K tokens, block 512, k = 3, the 0.5B shape.)
    In budget: linear between profiled budgets (written so that equal neighbours give exactly
    their value: the tuner keeps the smaller of two budgets predicted equal); a budget outside
    the profiled range is an error, since attention time need not be linear in k.
    """

    def __init__(self, table: LatencyTable, source: str | None = None):
        """`source`: the table's file, for error messages (default: its name in a tables
        folder)."""
        self.table = table
        self.source = source or table_path("", table.device_kind, table.shape)
        self.block_size = table.shape.block_size
        self.pad_seconds_per_token = table.pad_seconds_per_token
        self.call_seconds = table.call_seconds
        self._lengths = np.asarray((0,) + table.lengths, dtype=np.float64)
        # What each length adds to a call; the n = 0 row adds nothing.
        added_LK = np.asarray(table.fitted_seconds_LK, dtype=np.float64) - table.call_seconds
        self._seconds_LK = np.concatenate([np.zeros((1, added_LK.shape[1])), added_LK])
        self._budgets = np.asarray(table.budgets, dtype=np.float64)
        # Past the longest length the last segment extends at its slope per budget made
        # non-decreasing in the budget (_non_decreasing), so that the extension keeps latency
        # from falling as k rises, as the rows inside the table do: where the longer length's
        # time rose less with k than the shorter one's (timing noise), the raw slopes would
        # fall with k and a long enough document would cost less at a larger budget. In the
        # bilinear formula the segment's lower row is then this one, not the row below it.
        span = self._lengths[-1] - self._lengths[-2]
        slope_K = np.asarray(_non_decreasing((self._seconds_LK[-1] - self._seconds_LK[-2]) / span))
        self._extend_from_K = self._seconds_LK[-1] - slope_K * span

    def fingerprint(self) -> str:
        return _digest(self.table.to_json_dict())

    @classmethod
    def load(cls, table_dir: str, device_kind: str, shape: LayerShape) -> ProfiledLatencyModel:
        return cls(load_table(table_dir, device_kind, shape),
                   table_path(table_dir, device_kind, shape))

    def doc_seconds(self, lengths_N, budget):
        lengths_N = np.asarray(lengths_N, dtype=np.float64)
        budget = np.asarray(budget, dtype=np.float64)
        lo, hi = self.table.budgets[0], self.table.budgets[-1]
        if budget.size and lengths_N.size and (budget.min() < lo or budget.max() > hi):
            raise ValueError(f"budget outside the profiled range [{lo}, {hi}]; re-profile with "
                             f"the budgets you use (`{PROFILE_COMMAND}`)")
        if lengths_N.size and budget.size:
            self._check_extrapolation(float(lengths_N.max()), int(np.ceil(budget.max())))
        # Lengths and budgets are bracketed apart and meet in the bilinear formula, which
        # broadcasts: K budgets x N documents cost K + N lookups, not K * N.
        li, lw = _bracket(self._lengths, lengths_N)
        past = lengths_N > self._lengths[-1]
        if len(self._budgets) == 1:  # one column: every budget reads it
            ki = ki_next = np.zeros(budget.shape, dtype=np.int64)
            kw = 0.0
        else:
            ki, kw = _bracket(self._budgets, budget)
            ki_next = ki + 1
        s = self._seconds_LK
        li_next = li + 1
        e = self._extend_from_K
        low = np.where(past, e[ki] + (e[ki_next] - e[ki]) * kw,
                       s[li, ki] + (s[li, ki_next] - s[li, ki]) * kw)
        high = s[li_next, ki] + (s[li_next, ki_next] - s[li_next, ki]) * kw
        return low * (1 - lw) + high * lw

    def _check_extrapolation(self, longest_doc: float, top_budget: int) -> None:
        longest = self.table.lengths[-1]
        start = int(self._lengths[-2])  # The last segment's start (0 for a one-length table).
        # The budget column the interpolation reads at top_budget (the next profiled budget).
        budgets = self.table.budgets
        k = budgets[min(int(np.searchsorted(budgets, top_budget)), len(budgets) - 1)]
        needed = (k - 1) * self.block_size
        if longest_doc > longest and start < needed:
            # Two lengths from (k - 1) blocks on make the last segment linear.
            first = max(needed, self.block_size)
            lengths = sorted(set(self.table.lengths) | {first, first + self.block_size})
            raise ValueError(
                f"a document of {int(longest_doc)} tokens is longer than the latency table's "
                f"longest profiled length {longest} ({self.source}), and the table extends "
                f"linearly at budget {top_budget} (profiled budget {k}) only where its last "
                f"two lengths are at least (budget - 1) x block_size = {k - 1} x "
                f"{self.block_size} = {needed} tokens (its last segment starts at {start}); "
                f"profile those lengths: `{PROFILE_COMMAND} "
                f"--lengths={','.join(str(n) for n in lengths)} ...`")


class EmaCorrection:
    """Per-shard EMA of measured/predicted time ratios; `correct` scales predictions by it.

    The first observation of a shard sets its ratio outright (no bias towards the prior 1.0);
    later ones blend with weight (1 - decay). `error_S` is the same EMA of the corrected
    prediction's relative error, |measured / (predicted x ratio before the update) - 1|, from
    the second observation on: how far the tuner can trust a corrected prediction (its dead
    band). State is a dict of lists (JSON, so it checkpoints with orbax's JSON handler beside
    the data-iterator state).
    """

    def __init__(self, num_shards: int, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EmaCorrection decay={decay} must be in [0, 1)")
        self.decay = decay
        self.ratio_S = np.ones(num_shards, dtype=np.float64)
        self.error_S = np.zeros(num_shards, dtype=np.float64)
        self.count_S = np.zeros(num_shards, dtype=np.int64)

    def update(self, measured_S: np.ndarray, predicted_S: np.ndarray) -> None:
        measured_S = np.asarray(measured_S, dtype=np.float64)
        predicted_S = np.asarray(predicted_S, dtype=np.float64)
        if measured_S.shape != self.ratio_S.shape or predicted_S.shape != self.ratio_S.shape:
            raise ValueError(f"expected [{self.ratio_S.size}] measured and predicted times, got "
                             f"{measured_S.shape} and {predicted_S.shape}")
        if not (np.all(predicted_S > 0) and np.all(measured_S > 0)):
            raise ValueError("measured and predicted times must be positive")
        observed_S = measured_S / predicted_S
        miss_S = np.abs(observed_S / self.ratio_S - 1.0)
        self.error_S = np.select(
            [self.count_S == 0, self.count_S == 1],
            [self.error_S, miss_S], self.decay * self.error_S + (1.0 - self.decay) * miss_S)
        blended_S = self.decay * self.ratio_S + (1.0 - self.decay) * observed_S
        self.ratio_S = np.where(self.count_S == 0, observed_S, blended_S)
        self.count_S = self.count_S + 1

    def correct(self, predicted_S: np.ndarray) -> np.ndarray:
        return np.asarray(predicted_S, dtype=np.float64) * self.ratio_S

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"ratio_S": self.ratio_S.tolist(), "error_S": self.error_S.tolist(),
                "count_S": self.count_S.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ratio_S = np.asarray(state["ratio_S"], dtype=np.float64)
        # States saved before the error EMA existed have no "error_S": start it at zero.
        error_S = np.asarray(state.get("error_S", np.zeros_like(ratio_S)), dtype=np.float64)
        count_S = np.asarray(state["count_S"], dtype=np.int64)
        for name, x in (("ratio_S", ratio_S), ("error_S", error_S), ("count_S", count_S)):
            if x.shape != self.ratio_S.shape:
                raise ValueError(f"EMA state {name} for {x.size} shards, this run has "
                                 f"{self.ratio_S.size}")
        self.ratio_S = ratio_S.copy()
        self.error_S = error_S.copy()
        self.count_S = count_S.copy()


def make_latency_model(kind: str, shape: LayerShape, *, table_dir: str = "",
                       device_kind: str = "") -> LatencyModel:
    """'analytic' or 'profiled' (the latter needs the tables folder and the device kind,
    e.g. `jax.devices()[0].device_kind`)."""
    if kind == "analytic":
        return AnalyticLatencyModel(shape)
    if kind == "profiled":
        if not table_dir or not device_kind:
            raise ValueError("a profiled latency model needs table_dir and device_kind")
        return ProfiledLatencyModel.load(table_dir, device_kind, shape)
    raise ValueError(f"latency model kind {kind!r} not in ('analytic', 'profiled')")

