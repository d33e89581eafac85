"""Packing documents into fixed-length rows: the contract the batchers call.

Every document starts at a multiple of `align` (the MoBA block size), so a KV block never holds
the tail of one document and the head of the next, and each document's block count is
ceil(n / align) wherever it lands. The gap after a document (up to the next aligned start) and
the end of a row are padding: segment id 0, loss 0, position 0, token PAD.

Packed row arrays, all [num_rows, row_len]:

    inputs, targets  int32    token ids (PAD in padding)
    loss_mask        float32  the documents' loss masks, 0 in padding
    segment_ids      int32    1..k for the k documents of a row, in row order; 0 = padding
    positions        int32    0..n-1 inside each document, 0 in padding

A document longer than a row is an error naming its length: cropping happens in the pipeline
before batching (documents.crop_document), never here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sparsebalance_jax.data.documents import Document
from sparsebalance_jax.data.tokenizer import PAD_ID

ROW_KEYS = ("inputs", "targets", "loss_mask", "segment_ids", "positions")


def aligned_length(length: int, align: int) -> int:
    """Slots a document of `length` tokens takes in a row: its length rounded up to `align`."""
    return -(-int(length) // align) * align


def _check_geometry(row_len: int, align: int) -> None:
    if align < 1 or row_len < 1 or row_len % align:
        raise ValueError(f"row_len ({row_len}) must be a positive multiple of align ({align})")


def assign_rows(lengths: Sequence[int], num_rows: int, row_len: int,
                align: int) -> list[list[int]] | None:
    """First-fit-decreasing assignment of documents (by length) to `num_rows` rows.

    Returns, per row, the indices into `lengths` in the order they are laid out, or None when
    they do not all fit. Each document takes aligned_length(n, align) slots; since row_len is a
    multiple of align this is exact for the last document of a row too. Ties keep input order,
    so the result is deterministic.
    """
    _check_geometry(row_len, align)
    lengths = [int(n) for n in lengths]
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"document {i} has length {n}; documents need >= 1 token")
        if n > row_len:
            raise ValueError(f"document {i} has {n} tokens, more than row_len={row_len}; crop "
                             "documents to the maximum document length before batching")
    free = [row_len] * num_rows
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        need = aligned_length(lengths[i], align)
        row = next((r for r in range(num_rows) if free[r] >= need), None)
        if row is None:
            return None
        rows[row].append(i)
        free[row] -= need
    return rows


def pack_rows(docs: Sequence[Document], num_rows: int, row_len: int, align: int,
              pad_id: int = PAD_ID) -> dict[str, np.ndarray]:
    """Packs `docs` into [num_rows, row_len] arrays (see module doc); raises if they don't fit."""
    lengths = [len(d["inputs"]) for d in docs]
    rows = assign_rows(lengths, num_rows, row_len, align)
    if rows is None:
        total = sum(aligned_length(n, align) for n in lengths)
        raise ValueError(f"{len(docs)} documents (lengths {sorted(lengths, reverse=True)}, "
                         f"{total} aligned slots) do not fit in {num_rows} rows of {row_len}")
    shape = (num_rows, row_len)
    out = {"inputs": np.full(shape, pad_id, np.int32), "targets": np.full(shape, pad_id, np.int32),
           "loss_mask": np.zeros(shape, np.float32), "segment_ids": np.zeros(shape, np.int32),
           "positions": np.zeros(shape, np.int32)}
    for r, row in enumerate(rows):
        start = 0
        for segment, i in enumerate(row, start=1):
            n, doc = lengths[i], docs[i]
            span = slice(start, start + n)
            out["inputs"][r, span] = doc["inputs"]
            out["targets"][r, span] = doc["targets"]
            out["loss_mask"][r, span] = doc["loss_mask"]
            out["segment_ids"][r, span] = segment
            out["positions"][r, span] = np.arange(n, dtype=np.int32)
            start += aligned_length(n, align)
    return out
