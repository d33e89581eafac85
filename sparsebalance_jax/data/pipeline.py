"""The grain input pipeline: a random-access dataset of documents, then batched step batches.

`document_dataset` is a `grain.MapDataset` of documents (documents.py records). Index i maps
deterministically to its content, so the dataset is resumable by index alone:

- source: grain's proportional mixture (`MapDataset.mix`) of the enabled sources by weight;
  it interleaves them in exact proportions and maps i -> (source, index within the source);
- text / synthetic document j: a fresh `np.random.default_rng([seed, source tag, j])` draws its
  length (lengths.sample_lengths) and its content (sources.py);
- jsonl record j: a per-epoch shuffle of the validated records (each record once per epoch).

Every document is cropped to `max_doc_len` here, explicitly and counted (CropCounter), before
any batching; packing never shortens a document.

`train_iterator` feeds those documents (in index order) to a batcher from
`sparsebalance_jax.data.batching` (random / lbb / sab), whose elements are step batches:
[S, M, R, T] arrays inputs / targets / loss_mask / segment_ids / positions and int32 budgets
[S, M, R] (S data shards, M micro-batches, R rows, T tokens). Multi-host: the batcher must see
the whole global batch to balance it, so every process runs the same (deterministic) document
stream and batcher and keeps only its own shards [shard_index * S / shard_count, ...); grain's
per-process index sharding would give each process different documents and make global
balancing impossible. The iterator's get_state()/set_state() round-trips (grain), so a resumed
run continues the same order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from typing import Any

import grain
import numpy as np

from sparsebalance_jax.data import documents, lengths, sources
from sparsebalance_jax.data.batching import make_batcher
from sparsebalance_jax.data.documents import CropCounter, Document
from sparsebalance_jax.data.jsonl import JsonlIndex
from sparsebalance_jax.data.tokenizer import TOKENIZER_KINDS, make_tokenizer

# Per-source rng tags: the same document index in two sources draws unrelated content.
_TEXT, _SYNTHETIC, _JSONL = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What the documents are: sources and their weights, lengths, limits, tokenizer.

    Field names match `sparsebalance_jax.config.DataConfig` so the config maps onto it directly.
    """

    text_weight: float = 1.0  # Share of Wikipedia text documents.
    synthetic_weight: float = 0.0  # Share of synthetic long-context tasks.
    jsonl_weight: float = 0.0  # Share of local jsonl conversations.
    jsonl_paths: tuple[str, ...] = ()  # jsonl files (jsonl.py lists the layouts).
    synthetic_tasks: tuple[str, ...] = sources.SYNTHETIC_TASKS  # Tasks drawn uniformly.
    length_distribution: str = "longalign"  # lengths.LENGTH_KINDS.
    length_scale: float = 1 / 32  # Multiplies the distribution's real-scale token lengths.
    min_doc_len: int = 64  # Generated documents are at least this long (tokens).
    max_doc_len: int = 2304  # Generated lengths are at most this; longer records are cropped.
    max_bad_lines: int = 0  # Malformed jsonl lines tolerated before failing.
    tokenizer: str = "bytes"  # tokenizer.TOKENIZER_KINDS.
    text_path: str | None = None  # Wikipedia extracts JSON; None: the installed package's file.

    def __post_init__(self):
        weights = (self.text_weight, self.synthetic_weight, self.jsonl_weight)
        _require(all(w >= 0 for w in weights) and sum(weights) > 0, "text_weight",
                 f"source weights {weights} must be >= 0 with a positive sum")
        _require(self.jsonl_weight == 0 or self.jsonl_paths, "jsonl_paths",
                 "jsonl_weight > 0 needs at least one path")
        _require(self.synthetic_weight == 0 or self.synthetic_tasks, "synthetic_tasks",
                 "synthetic_weight > 0 needs at least one task")
        unknown = set(self.synthetic_tasks) - set(sources.SYNTHETIC_TASKS)
        _require(not unknown, "synthetic_tasks",
                 f"unknown {sorted(unknown)}; known {sources.SYNTHETIC_TASKS}")
        if self.synthetic_weight > 0:  # Fail at start, not in a reader thread mid-run.
            for task in self.synthetic_tasks:
                smallest = sources.min_synthetic_tokens(task)
                _require(smallest <= self.max_doc_len, "synthetic_tasks",
                         f"task {task!r} needs ~{smallest} tokens, more than max_doc_len="
                         f"{self.max_doc_len}: cropping would cut its facts")
        _require(self.length_distribution in lengths.LENGTH_KINDS, "length_distribution",
                 f"{self.length_distribution!r} not in {lengths.LENGTH_KINDS}")
        _require(self.length_scale > 0, "length_scale", f"must be > 0, got {self.length_scale}")
        _require(2 <= self.min_doc_len <= self.max_doc_len, "min_doc_len",
                 f"need 2 <= min_doc_len ({self.min_doc_len}) <= max_doc_len "
                 f"({self.max_doc_len})")
        _require(self.max_bad_lines >= 0, "max_bad_lines", "must be >= 0")
        _require(self.tokenizer in TOKENIZER_KINDS, "tokenizer",
                 f"{self.tokenizer!r} not in {TOKENIZER_KINDS}")


class DataSpecError(ValueError):
    """A DataSpec field that cannot work: `field` names it, `message` says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"DataSpec.{field}: {message}")
        self.field, self.message = field, message


def _require(ok: Any, field: str, message: str) -> None:
    if not ok:
        raise DataSpecError(field, message)


class _GeneratedSource:
    """Random-access, unbounded source: document j is a pure function of (seed, tag, j)."""

    def __init__(self, spec: DataSpec, seed: int, tag: int):
        self._spec, self._seed, self._tag = spec, seed, tag
        self._tokenizer = make_tokenizer(spec.tokenizer)

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: int) -> Document:
        spec = self._spec
        rng = np.random.default_rng([self._seed, self._tag, int(index)])
        (length,) = lengths.sample_lengths(spec.length_distribution, rng, 1, spec.length_scale,
                                           spec.min_doc_len, spec.max_doc_len)
        corpus = sources.load_corpus(spec.text_path, spec.tokenizer)
        if self._tag == _TEXT:
            return sources.text_document(corpus, self._tokenizer, rng, int(length))
        return sources.synthetic_document(corpus, self._tokenizer, rng, int(length),
                                          spec.synthetic_tasks)


def _jsonl_document(turns, tokenizer_kind: str) -> Document:
    tokenizer = make_tokenizer(tokenizer_kind)
    return documents.make_document(*documents.chat_tokens(turns, tokenizer))


def document_dataset(spec: DataSpec, seed: int, *,
                     crop_counter: CropCounter | None = None) -> grain.MapDataset:
    """Unbounded, deterministic, random-access MapDataset of documents (see module doc); a
    synthetic task too long for max_doc_len was refused when `spec` was made."""
    parts, weights = [], []
    for tag, weight in ((_TEXT, spec.text_weight), (_SYNTHETIC, spec.synthetic_weight)):
        if weight > 0:
            parts.append(grain.MapDataset.source(_GeneratedSource(spec, seed, tag)))
            weights.append(weight)
    if spec.jsonl_weight > 0:
        records = JsonlIndex(spec.jsonl_paths, spec.max_bad_lines)
        # grain shuffles epoch e with seed + e, so the run's seed itself would make seed s + 1's
        # order seed s's one epoch on; a seed drawn from (seed, tag) keeps seeds unrelated.
        shuffle_seed = int(np.random.SeedSequence([seed % 2**32, _JSONL]).generate_state(1)[0])
        parts.append(grain.MapDataset.source(records).shuffle(seed=shuffle_seed).repeat()
                     .map(functools.partial(_jsonl_document, tokenizer_kind=spec.tokenizer)))
        weights.append(spec.jsonl_weight)
    mixed = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, weights)
    return mixed.map_with_index(functools.partial(_crop, max_len=spec.max_doc_len,
                                                  counter=crop_counter))


def _crop(index: int, doc: Document, max_len: int, counter: CropCounter | None) -> Document:
    return documents.crop_document(doc, max_len, counter, where=f"document {index}")


def _shard_slice(batch: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    return {k: v[lo:hi] for k, v in batch.items()}


def train_iterator(spec: DataSpec, seed: int, num_shards: int, micro_batches: int,
                   rows_per_micro_batch: int, row_len: int, block_size: int, base_budget: int,
                   batcher: str = "lbb", shard_index: int = 0, shard_count: int = 1, *,
                   cost_model: Any, window: int = 1,
                   crop_counter: CropCounter | None = None,
                   read_options: grain.ReadOptions | None = None) -> grain.DatasetIterator:
    """Iterator of step batches for this process's shards (see module doc).

    Elements: dict of np arrays inputs / targets / loss_mask / segment_ids / positions
    [S_local, M, R, T] and budgets int32 [S_local, M, R], S_local = num_shards / shard_count.
    `cost_model` (a balance.latency.LatencyModel) and `window` (global batches balanced
    together) go to the batcher.
    """
    if num_shards < 1 or shard_count < 1 or num_shards % shard_count:
        raise ValueError(f"num_shards ({num_shards}) must be a positive multiple of "
                         f"shard_count ({shard_count})")
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if row_len % block_size:
        raise ValueError(f"row_len ({row_len}) must be a multiple of block_size ({block_size})")
    if spec.max_doc_len > row_len:
        raise ValueError(f"DataSpec.max_doc_len ({spec.max_doc_len}) exceeds row_len "
                         f"({row_len}): such a document could never be packed")
    # Small prefetch: long documents are large, and 2-core CPU hosts gain nothing from more.
    read_options = read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=16)
    docs = document_dataset(spec, seed, crop_counter=crop_counter).to_iter_dataset(read_options)
    steps = make_batcher(batcher, docs, num_shards=num_shards, micro_batches=micro_batches,
                         rows_per_micro_batch=rows_per_micro_batch, row_len=row_len,
                         align=block_size, base_budget=base_budget, window=window,
                         cost_model=cost_model, seed=seed)
    if shard_count > 1:
        per_process = num_shards // shard_count
        lo = shard_index * per_process
        steps = steps.map(functools.partial(_shard_slice, lo=lo, hi=lo + per_process))
    return iter(steps)


class Lookahead:
    """A step-batch iterator that can hand out its next element early (`peek`) and is
    checkpointed as if it had not: `get_state()` is the state before a batch peeked at and not
    yet taken by `next`, so a run resumed from a checkpoint written while one was held starts
    with that batch. The train loop peeks at the next step's batch while the current step runs
    (to start DST's coverage probe on it).

    Checkpointed through `grain.checkpoint` as an iterator whose state is bytes (the JSON that
    grain writes for its own dataset iterators, byte for byte, so either restores the other's
    checkpoints)."""

    def __init__(self, iterator: grain.DatasetIterator):
        self._iterator = iterator
        # (state before the element, the element, the error taking it raised), while held.
        self._held: tuple[bytes, Any, Exception | None] | None = None

    def __iter__(self):
        return self

    def __next__(self):
        if self._held is None:
            return next(self._iterator)
        _, batch, error = self._held
        self._held = None
        if error is not None:
            raise error
        return batch

    def peek(self):
        """The element `next` returns next, taken from the iterator now; None if taking it
        raised (StopIteration included): that `next` raises the error, so it surfaces where it
        would have without the peek."""
        if self._held is None:
            before = self._state_bytes()  # serialised now: the iterator may reuse its state
            try:
                self._held = (before, next(self._iterator), None)
            except Exception as e:  # noqa: BLE001 - kept for `next`, not handled here
                self._held = (before, None, e)
        return self._held[1]

    def _state_bytes(self) -> bytes:
        return json.dumps(self._iterator.get_state(), indent=4).encode()

    def get_state(self) -> bytes:
        return self._state_bytes() if self._held is None else self._held[0]

    def set_state(self, state: bytes) -> None:
        self._held = None
        self._iterator.set_state(json.loads(state))

    def start_prefetch(self) -> None:
        self._iterator.start_prefetch()
