"""Batchers: documents -> step batches [S, M, R, T] balanced across data shards.

Owns the window rule, the three assignment methods (`random`, `lbb`, `sab`), the step-batch
layout and the grain transformation with checkpointable state (`make_batcher`).

Geometry: S data shards x M micro-batches per shard ("bins", S*M per step), each bin R rows of T
tokens; documents start at multiples of `align` (the MoBA block) and are packed into a bin's rows
by `packing.assign_rows` (first-fit-decreasing), which is also the capacity test.

Window (what it does to data order). The batcher reads the parent's documents in order into a
window holding up to `window` global batches of tokens: it adds documents while their aligned
tokens stay within window * S*M*R*T * fill (the first document always enters; the one that
would overflow opens the next window). The window's documents are then assigned to
n_steps = ceil(tokens / (S*M*R*T * fill)) steps (one more, repeatedly, if they do not fit), and
those steps are emitted in order. So order is kept between windows, and inside a window a
document may move to any of its <= window (+1) steps: a reordering of at most one window. `fill`
< 1 leaves slack so the assignment has room to balance and to pack rows.

Exactly once: every document read enters exactly one window, and a window's plan puts each of
its documents in exactly one (step, shard, micro-batch); the partial window at the end of the
epoch is emitted too (its steps may leave bins empty). A document that fits no row
(aligned length > T) is an error naming its length.

Methods (same windows, same geometry; they differ in who goes where):
- random: no balancing. The window's documents, longest first, each to a bin drawn at random
  among those that can take it; bins go to (step, shard, micro-batch) in a random order. (Longest
  first so that the bins fill as the other methods' do: dealt in a random order, the short
  documents spread over every bin and a late long one fits none, so the window takes more,
  emptier steps.)
- lbb: length-based batching, the usual baseline: documents longest first, each to the bin with
  the fewest tokens that can take it, so token counts are balanced; bins go to steps randomly.
- sab: sparsity-aware batching. Minimises the largest predicted bin latency (cost model at the
  base budget): longest-processing-time-first greedy on predicted cost under the capacity test,
  then local improvement (moves and swaps out of the most expensive bin). Bins are then sorted
  by cost and cut into steps (bins of similar cost share a step), and inside a step bins go to
  shards by LPT with M slots each, balancing each shard's summed micro-batch latency.

Step batch (one element): [S, M, R, T] arrays inputs, targets (int32), loss_mask (float32),
segment_ids, positions (int32); budgets int32 [S, M, R] (the base budget of every row; the tuner
changes it later); doc_lengths int32 [S, M, D] and doc_ids int64 [S, M, D] (D = R*T // align,
the most documents a bin can hold; 0 / -1 where empty; doc_ids count documents from the start
of the parent stream); predicted_seconds float32 [S, M] (cost model, base budget, padding
included). Deterministic given the seed: window w uses rng(seed, w).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import grain
import numpy as np

from sparsebalance_jax.balance.latency import LatencyModel
from sparsebalance_jax.data.packing import ROW_KEYS, aligned_length, assign_rows, pack_rows

BATCHERS = ("random", "lbb", "sab")
DEFAULT_FILL = 0.9


@dataclasses.dataclass(frozen=True)
class StepGeometry:
    num_shards: int
    micro_batches: int
    rows_per_micro_batch: int
    row_len: int
    align: int

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"{field.name}={getattr(self, field.name)} must be >= 1")
        if self.row_len % self.align:
            raise ValueError(f"row_len={self.row_len} is not a multiple of align={self.align}")

    @property
    def bins_per_step(self) -> int:
        return self.num_shards * self.micro_batches

    @property
    def bin_tokens(self) -> int:
        return self.rows_per_micro_batch * self.row_len

    @property
    def max_docs_per_bin(self) -> int:
        return self.bin_tokens // self.align


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """Where each of a window's N documents goes: step_N, shard_N, micro_N (int64 [N])."""

    num_steps: int
    step_N: np.ndarray
    shard_N: np.ndarray
    micro_N: np.ndarray


def step_capacity_tokens(geometry: StepGeometry, fill: float) -> float:
    return geometry.num_shards * geometry.micro_batches * geometry.bin_tokens * fill


def window_accepts(window_tokens: int, doc_tokens: int, target_tokens: float) -> bool:
    """The window rule: a document joins if the window is empty or it stays within the target."""
    return window_tokens == 0 or window_tokens + doc_tokens <= target_tokens


def check_fits_row(length: int, geometry: StepGeometry) -> None:
    if aligned_length(length, geometry.align) > geometry.row_len:
        raise ValueError(f"a document of {length} tokens does not fit a row of row_len="
                         f"{geometry.row_len} (align {geometry.align}); crop documents to at "
                         "most row_len tokens before batching")


class _Bins:
    """Bins under construction: documents, aligned tokens and predicted cost per bin."""

    def __init__(self, num_bins: int, geometry: StepGeometry, aligned_N: np.ndarray,
                 lengths_N: np.ndarray, cost_N: np.ndarray):
        self.g = geometry
        self.docs: list[list[int]] = [[] for _ in range(num_bins)]
        self.tokens_B = np.zeros(num_bins, dtype=np.int64)
        self.cost_B = np.zeros(num_bins, dtype=np.float64)
        self.aligned_N, self.lengths_N, self.cost_N = aligned_N, lengths_N, cost_N

    def fits(self, b: int, add: Sequence[int], remove: Sequence[int] = ()) -> bool:
        tokens = (self.tokens_B[b] + self.aligned_N[list(add)].sum()
                  - self.aligned_N[list(remove)].sum())
        if tokens > self.g.bin_tokens:
            return False
        if self.g.rows_per_micro_batch == 1:
            return True  # one row: the aligned-token count is the exact test
        members = [d for d in self.docs[b] if d not in remove] + list(add)
        return assign_rows(self.lengths_N[members], self.g.rows_per_micro_batch,
                           self.g.row_len, self.g.align) is not None

    def put(self, b: int, d: int) -> None:
        self.docs[b].append(d)
        self.tokens_B[b] += self.aligned_N[d]
        self.cost_B[b] += self.cost_N[d]

    def take(self, b: int, d: int) -> None:
        self.docs[b].remove(d)
        self.tokens_B[b] -= self.aligned_N[d]
        self.cost_B[b] -= self.cost_N[d]


def _random_fitting_bin(bins: _Bins, order: np.ndarray, rng: np.random.Generator) -> bool:
    """Each document (in `order`) to a bin drawn uniformly among those that can take it: the
    first that fits in a fresh random order of the bins."""
    num_bins = len(bins.docs)
    for d in order:
        for b in rng.permutation(num_bins):
            if bins.fits(b, [d]):
                bins.put(b, d)
                break
        else:
            return False
    return True


def _greedy_least_loaded(bins: _Bins, order: np.ndarray, load_B: np.ndarray,
                         weight_N: np.ndarray) -> bool:
    """Each document (in `order`) to the least-loaded bin that can take it."""
    for d in order:
        for b in np.argsort(load_B, kind="stable"):
            if bins.fits(b, [d]):
                bins.put(b, d)
                load_B[b] += weight_N[d]
                break
        else:
            return False
    return True


def _improve(bins: _Bins, max_rounds: int, swap_candidates: int = 16) -> None:
    """Local search on the most expensive bin: move one of its documents to a cheaper bin, or
    swap it with a cheaper document there, whenever that lowers this bin without making the
    other one at least as expensive."""
    cost_B = bins.cost_B
    for _ in range(max_rounds):
        b = int(np.argmax(cost_B))
        top, eps = cost_B[b], 1e-12 * max(cost_B[b], 1e-30)
        others = [j for j in np.argsort(cost_B, kind="stable") if j != b]
        mine = sorted(bins.docs[b], key=lambda d: -bins.cost_N[d])
        if _try_move(bins, b, mine, others, top, eps) or _try_swap(
                bins, b, mine, others[:swap_candidates], top, eps):
            continue
        return


def _try_move(bins, b, mine, others, top, eps) -> bool:
    for d in mine:
        if bins.cost_N[d] <= eps:
            # Moving it would not lower bin b (a cost model may price a short document below
            # the padding its tokens replace); `mine` is costliest first, so neither would the rest.
            return False
        for j in others:
            if bins.cost_B[j] + bins.cost_N[d] >= top - eps:
                break  # `others` is cheapest first: no later bin can take d either
            if bins.fits(j, [d]):
                bins.take(b, d)
                bins.put(j, d)
                return True
    return False


def _try_swap(bins, b, mine, others, top, eps) -> bool:
    for d in mine:
        for j in others:
            for e in bins.docs[j]:
                delta = bins.cost_N[d] - bins.cost_N[e]
                if delta <= eps or bins.cost_B[j] + delta >= top - eps:
                    continue
                if bins.fits(j, [d], [e]) and bins.fits(b, [e], [d]):
                    bins.take(b, d)
                    bins.take(j, e)
                    bins.put(j, d)
                    bins.put(b, e)
                    return True
    return False


def _assign_bins(method: str, num_bins: int, geometry: StepGeometry, lengths_N: np.ndarray,
                 cost_N: np.ndarray, rng: np.random.Generator) -> _Bins | None:
    aligned_N = -(-lengths_N // geometry.align) * geometry.align
    bins = _Bins(num_bins, geometry, aligned_N, lengths_N, cost_N)
    n = len(lengths_N)
    tie_N = rng.permutation(n)  # random tie-break among equal keys
    if method == "random":
        ok = _random_fitting_bin(bins, np.lexsort((tie_N, -lengths_N)), rng)
    elif method == "lbb":
        order = np.lexsort((tie_N, -lengths_N))
        ok = _greedy_least_loaded(bins, order, np.zeros(num_bins), aligned_N.astype(np.float64))
    elif method == "sab":
        order = np.lexsort((tie_N, -cost_N))
        ok = _greedy_least_loaded(bins, order, bins.cost_B, np.zeros(n))
        # `load_B` is bins.cost_B itself (put() already adds the cost), hence zero weights.
        if ok:
            _improve(bins, max_rounds=4 * n)
    else:
        raise ValueError(f"batcher {method!r} not in {BATCHERS}")
    return bins if ok else None


def _arrange_steps(method: str, bins: _Bins, num_steps: int, geometry: StepGeometry,
                   rng: np.random.Generator) -> np.ndarray:
    """bin -> (step, shard, micro) as an int64 [num_bins, 3] table."""
    S, M = geometry.num_shards, geometry.micro_batches
    num_bins = num_steps * S * M
    where = np.zeros((num_bins, 3), dtype=np.int64)
    if method != "sab":
        for slot, b in enumerate(rng.permutation(num_bins)):
            step, rest = divmod(slot, S * M)
            where[b] = (step, rest // M, rest % M)
        return where
    by_cost = np.argsort(-bins.cost_B, kind="stable")
    for step in range(num_steps):
        shard_cost = np.zeros(S)
        shard_used = np.zeros(S, dtype=np.int64)
        for b in by_cost[step * S * M:(step + 1) * S * M]:  # most expensive first
            free = np.flatnonzero(shard_used < M)
            shard = free[np.argmin(shard_cost[free])]
            where[b] = (step, shard, shard_used[shard])
            shard_cost[shard] += bins.cost_B[b]
            shard_used[shard] += 1
    return where


def plan_window(method: str, lengths_N: np.ndarray, geometry: StepGeometry,
                cost_model: LatencyModel, base_budget: int, rng: np.random.Generator,
                fill: float = DEFAULT_FILL) -> WindowPlan:
    """Assign one window's documents to steps x shards x micro-batches (see module doc)."""
    lengths_N = np.asarray(lengths_N, dtype=np.int64)
    if lengths_N.size == 0:
        raise ValueError("plan_window needs at least one document")
    for n in (lengths_N.min(), lengths_N.max()):
        check_fits_row(int(n), geometry)
    if lengths_N.min() < 1:
        raise ValueError("documents need at least one token")
    # Bins of equal capacity all pay the padding term on their free tokens, so the cost to
    # balance is each document's own cost minus the padding its tokens replace.
    cost_N = (cost_model.doc_seconds(lengths_N, base_budget)
              - lengths_N * cost_model.pad_seconds_per_token)
    aligned_tokens = int((-(-lengths_N // geometry.align) * geometry.align).sum())
    num_steps = max(1, math.ceil(aligned_tokens / step_capacity_tokens(geometry, fill) - 1e-9))
    # Every document fits a row, so a bin each always suffices: past that, a failure to place
    # them is the batcher's fault, an error rather than an endless loop.
    most_steps = max(num_steps, -(-len(lengths_N) // geometry.bins_per_step))
    while (bins := _assign_bins(method, num_steps * geometry.bins_per_step, geometry,
                                lengths_N, cost_N, rng)) is None:
        num_steps += 1
        if num_steps > most_steps:
            raise RuntimeError(f"batcher {method!r} placed {len(lengths_N)} documents in no "
                               f"plan of up to {most_steps} steps (a bin each fits them)")
    where = _arrange_steps(method, bins, num_steps, geometry, rng)
    bin_N = np.empty(len(lengths_N), dtype=np.int64)
    for b, docs in enumerate(bins.docs):
        bin_N[docs] = b
    return WindowPlan(num_steps=num_steps, step_N=where[bin_N, 0], shard_N=where[bin_N, 1],
                      micro_N=where[bin_N, 2])


def split_windows(lengths: np.ndarray, geometry: StepGeometry, window: int,
                  fill: float = DEFAULT_FILL) -> list[np.ndarray]:
    """Index ranges of the windows a stream of documents forms (the iterator's rule)."""
    target = window * step_capacity_tokens(geometry, fill)
    windows, current, tokens = [], [], 0
    for i, n in enumerate(lengths):
        a = aligned_length(int(n), geometry.align)
        if not window_accepts(tokens, a, target):
            windows.append(np.asarray(current))
            current, tokens = [], 0
        current.append(i)
        tokens += a
    if current:
        windows.append(np.asarray(current))
    return windows


def predicted_step_seconds(plan: WindowPlan, lengths_N: np.ndarray, geometry: StepGeometry,
                           cost_model: LatencyModel, base_budget: int) -> np.ndarray:
    """Predicted seconds float64 [num_steps, S]: each shard's micro-batches summed."""
    S, M = geometry.num_shards, geometry.micro_batches
    seconds_TSM = np.full((plan.num_steps, S, M), cost_model.call_seconds
                          + geometry.bin_tokens * cost_model.pad_seconds_per_token)
    marginal_N = (cost_model.doc_seconds(lengths_N, base_budget)
                  - np.asarray(lengths_N) * cost_model.pad_seconds_per_token)
    np.add.at(seconds_TSM, (plan.step_N, plan.shard_N, plan.micro_N), marginal_N)
    return seconds_TSM.sum(axis=2)


def build_step(docs: Sequence[dict], doc_ids: Sequence[int], plan: WindowPlan, step: int,
               geometry: StepGeometry, cost_model: LatencyModel,
               base_budget: int) -> dict[str, np.ndarray]:
    """Pack one step of a planned window into the step-batch layout (see module doc)."""
    g = geometry
    S, M, R, T, D = (g.num_shards, g.micro_batches, g.rows_per_micro_batch, g.row_len,
                     g.max_docs_per_bin)
    out = {key: None for key in ROW_KEYS}
    doc_lengths_SMD = np.zeros((S, M, D), dtype=np.int32)
    doc_ids_SMD = np.full((S, M, D), -1, dtype=np.int64)
    in_step = np.flatnonzero(plan.step_N == step)
    for s in range(S):
        for m in range(M):
            members = in_step[(plan.shard_N[in_step] == s) & (plan.micro_N[in_step] == m)]
            rows = pack_rows([docs[i] for i in members], R, T, g.align)
            for key in ROW_KEYS:
                if out[key] is None:
                    out[key] = np.zeros((S, M, R, T), dtype=rows[key].dtype)
                out[key][s, m] = rows[key]
            doc_lengths_SMD[s, m, :len(members)] = [len(docs[i]["inputs"]) for i in members]
            doc_ids_SMD[s, m, :len(members)] = [doc_ids[i] for i in members]
    out["budgets"] = np.full((S, M, R), base_budget, dtype=np.int32)
    out["doc_lengths"] = doc_lengths_SMD
    out["doc_ids"] = doc_ids_SMD
    out["predicted_seconds"] = cost_model.predict_batch(
        doc_lengths_SMD.reshape(S * M, D), base_budget,
        padded_tokens=g.bin_tokens).reshape(S, M).astype(np.float32)
    return out


class BatcherStateError(ValueError):
    """A saved batcher state that cannot continue under this batcher's settings."""


class _BatcherIterator(grain.DatasetIterator):
    """State: the parent's state at the start of the current window, the window's index, the
    number of documents before it, how many of its steps were emitted, the window's documents
    and steps, and the settings that planned it. Restoring re-reads the window from the parent
    and re-plans it (deterministic), then skips the emitted steps. Under other settings the
    window would be cut and planned otherwise, so a state saved at the end of a window goes
    on with the next window under the new settings, and one saved inside a window is refused
    (BatcherStateError)."""

    def __init__(self, parent: grain.DatasetIterator, dataset: BatcherDataset):
        super().__init__(parent)
        self._ds = dataset
        self._target = dataset.window * step_capacity_tokens(dataset.geometry, dataset.fill)
        self._lookahead: tuple[dict, Any] | None = None  # (document, parent state before it)
        self._window_state = self._parent.get_state()
        self._window_index = 0
        self._docs_before = 0
        self._emitted = 0
        self._docs: list[dict] | None = None
        self._plan: WindowPlan | None = None

    def _read_window(self) -> None:
        docs, tokens = [], 0
        if self._lookahead is not None:
            doc, self._window_state = self._lookahead
            self._lookahead = None
            docs.append(doc)
            tokens += aligned_length(len(doc["inputs"]), self._ds.geometry.align)
        else:
            self._window_state = self._parent.get_state()
        while True:
            state_before = self._parent.get_state() if docs else self._window_state
            try:
                doc = next(self._parent)
            except StopIteration:
                break
            n = len(doc["inputs"])
            check_fits_row(n, self._ds.geometry)
            a = aligned_length(n, self._ds.geometry.align)
            if not window_accepts(tokens, a, self._target):
                self._lookahead = (doc, state_before)
                break
            docs.append(doc)
            tokens += a
        self._docs = docs
        if not docs:
            self._plan = None
            return
        rng = np.random.default_rng([self._ds.seed, self._window_index])
        lengths_N = np.array([len(d["inputs"]) for d in docs], dtype=np.int64)
        self._plan = plan_window(self._ds.method, lengths_N, self._ds.geometry,
                                 self._ds.cost_model, self._ds.base_budget, rng, self._ds.fill)

    def _next_window(self, finished_docs: int) -> None:
        """Reads and plans the window after the current one, which held `finished_docs`."""
        self._window_index += 1
        self._docs_before += finished_docs
        self._emitted = 0
        self._read_window()

    def __next__(self) -> dict[str, np.ndarray]:
        if self._docs is None:
            self._read_window()
        elif self._plan is not None and self._emitted >= self._plan.num_steps:
            self._next_window(len(self._docs))
        if self._plan is None:
            raise StopIteration
        ids = range(self._docs_before, self._docs_before + len(self._docs))
        step = build_step(self._docs, ids, self._plan, self._emitted, self._ds.geometry,
                          self._ds.cost_model, self._ds.base_budget)
        self._emitted += 1
        return step

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._window_state, "window_index": self._window_index,
                "docs_before": self._docs_before, "emitted": self._emitted,
                "window_docs": len(self._docs or ()),
                "window_steps": self._plan.num_steps if self._plan is not None else 0,
                "settings": self._ds.settings()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._window_state = state["parent"]
        self._lookahead = None
        self._window_index = int(state["window_index"])
        self._docs_before = int(state["docs_before"])
        emitted = int(state["emitted"])
        saved = state.get("settings")  # None: a state from before the settings were saved
        changed = [f"{k}: {saved.get(k)!r} -> {v!r}" for k, v in self._ds.settings().items()
                   if saved is not None and not _same_setting(k, saved.get(k), v)]
        if changed:
            steps, docs = int(state["window_steps"]), int(state["window_docs"])
            if emitted < steps:
                raise BatcherStateError(
                    f"the data iterator was saved after step {emitted} of the {steps} of its "
                    f"window {self._window_index}, planned with other settings ("
                    + "; ".join(changed) + "); a window cannot be planned again halfway. "
                    "Resume with the saved settings, or from a checkpoint at a window's end")
            for _ in range(docs):  # The finished window's documents, then the next window.
                next(self._parent)
            self._next_window(docs)
            return
        self._read_window()
        # The same settings over the same documents give the same window: a window read back
        # otherwise (another source, another tokenizer) would skip steps of another plan. (A
        # state saved before the first window was read, or before the window's size was saved,
        # has none to compare: (0, 0).)
        docs = len(self._docs or ())
        steps = self._plan.num_steps if self._plan is not None else 0
        saved_window = (int(state.get("window_docs", 0)), int(state.get("window_steps", 0)))
        if saved_window != (0, 0) and (docs, steps) != saved_window or emitted > steps:
            raise BatcherStateError(
                f"the data iterator's window {self._window_index} was saved with "
                f"{saved_window[0]} documents in {saved_window[1]} steps ({emitted} emitted) "
                f"and reads back as {docs} documents in {steps} steps: the documents differ "
                "from the saved run's (data source, tokenizer or document length limit "
                "changed?)")
        self._emitted = emitted


def _same_setting(key: str, saved: Any, now: Any) -> bool:
    """Whether a saved batcher setting equals this run's. A state from before the cost model's
    fingerprint was saved names only its class: taken as the same model (its numbers cannot be
    compared)."""
    if key == "cost_model" and isinstance(saved, str) and " " not in saved:
        return saved == now.split(" ")[0]
    return saved == now


class BatcherDataset(grain.IterDataset):
    """Documents -> step batches; see the module docstring."""

    def __init__(self, parent: grain.IterDataset, *, method: str, geometry: StepGeometry,
                 base_budget: int, window: int, cost_model: LatencyModel, seed: int,
                 fill: float = DEFAULT_FILL):
        super().__init__(parent)
        if method not in BATCHERS:
            raise ValueError(f"batcher {method!r} not in {BATCHERS}")
        if window < 1:
            raise ValueError(f"window={window} must be >= 1 (global batches per window)")
        if not 0.0 < fill <= 1.0:
            raise ValueError(f"fill={fill} must be in (0, 1]")
        if base_budget < 1:
            raise ValueError(f"base_budget={base_budget} must be >= 1")
        self.method, self.geometry, self.base_budget = method, geometry, base_budget
        self.window, self.cost_model, self.seed, self.fill = window, cost_model, seed, fill

    def __iter__(self) -> _BatcherIterator:
        return _BatcherIterator(self._parent.__iter__(), self)

    def settings(self) -> dict[str, Any]:
        """What the windows' cut and plan depend on (saved with the iterator's state)."""
        return dict(method=self.method, **dataclasses.asdict(self.geometry),
                    base_budget=self.base_budget, window=self.window, seed=self.seed,
                    fill=self.fill, cost_model=(f"{type(self.cost_model).__name__} "
                                                f"{self.cost_model.fingerprint()}"))

    def __str__(self) -> str:
        return f"BatcherDataset(method={self.method}, window={self.window}, {self.geometry})"


def make_batcher(name: str, parent: grain.IterDataset, *, num_shards: int, micro_batches: int,
                 rows_per_micro_batch: int, row_len: int, align: int, base_budget: int,
                 window: int, cost_model: LatencyModel, seed: int,
                 fill: float = DEFAULT_FILL) -> BatcherDataset:
    """The batching transformation `name` in {"random", "lbb", "sab"} over a document stream."""
    geometry = StepGeometry(num_shards=num_shards, micro_batches=micro_batches,
                            rows_per_micro_batch=rows_per_micro_batch, row_len=row_len,
                            align=align)
    return BatcherDataset(parent, method=name, geometry=geometry, base_budget=base_budget,
                          window=window, cost_model=cost_model, seed=seed, fill=fill)


def simulate_imbalance(method: str, lengths: np.ndarray, geometry: StepGeometry,
                       cost_model: LatencyModel, base_budget: int, window: int, seed: int,
                       fill: float = DEFAULT_FILL) -> np.ndarray:
    """Predicted imbalance (max / mean shard seconds) of every step the iterator would emit for
    a stream of document lengths, without packing tokens; float64 [steps]. The stream's last
    window is left out: it is the epoch's partial tail, whose empty bins no method can fill."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ratios = []
    for w, idx in enumerate(split_windows(lengths, geometry, window, fill)[:-1]):
        plan = plan_window(method, lengths[idx], geometry, cost_model, base_budget,
                           np.random.default_rng([seed, w]), fill)
        seconds_TS = predicted_step_seconds(plan, lengths[idx], geometry, cost_model,
                                            base_budget)
        ratios.append(seconds_TS.max(axis=1) / seconds_TS.mean(axis=1))
    if not ratios:
        raise ValueError("the stream forms a single window; give it more documents")
    return np.concatenate(ratios)
