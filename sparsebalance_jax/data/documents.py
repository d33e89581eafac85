"""The document record (the contract between sources, packing and the batchers) and its makers.

A document is a dict of three 1-D numpy arrays of one length n (the document's token count):

    inputs     int32[n]    token ids fed to the model
    targets    int32[n]    the next token of each input, inside the document
    loss_mask  float32[n]  1.0 where targets[i] is trained on, else 0.0

A sequence of tokens t_0..t_n (BOS first, EOS last) gives inputs = t_0..t_{n-1} and targets =
t_1..t_n, so n is the number of predictions. Conversations are rendered as

    BOS (ROLE content)* EOS        ROLE one of USER / ASSISTANT / SYSTEM

and trained on the assistant contents plus the token that closes each assistant turn (the next
role id or EOS), so the model learns where an answer ends. Crops are explicit (`crop_document`)
and counted (`CropCounter`); nothing downstream ever shortens a document.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

import numpy as np

from sparsebalance_jax.data.tokenizer import Tokenizer

Document = dict[str, np.ndarray]
DOCUMENT_KEYS = ("inputs", "targets", "loss_mask")


def make_document(tokens_L: np.ndarray, trained_L: np.ndarray) -> Document:
    """Document from tokens[L] and a per-token flag: trained_L[j] = predict token j (L >= 2)."""
    tokens_L = np.asarray(tokens_L, dtype=np.int32)
    trained_L = np.asarray(trained_L, dtype=bool)
    if tokens_L.ndim != 1 or tokens_L.shape != trained_L.shape or tokens_L.size < 2:
        raise ValueError(f"need matching 1-D tokens and flags of length >= 2, got "
                         f"{tokens_L.shape} and {trained_L.shape}")
    return {"inputs": tokens_L[:-1], "targets": tokens_L[1:],
            "loss_mask": trained_L[1:].astype(np.float32)}


def text_tokens(body_N: np.ndarray, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """BOS body EOS with every predicted token trained on: plain language modelling."""
    s = tokenizer.special
    tokens = np.concatenate([[s.bos], body_N, [s.eos]]).astype(np.int32)
    return tokens, np.ones(tokens.shape, dtype=bool)


def chat_tokens(turns: Sequence[tuple[str, str]],
                tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and trained flags of a conversation [(role, content), ...] (see module doc)."""
    s = tokenizer.special
    pieces, flags = [np.array([s.bos], np.int32)], [np.zeros(1, bool)]
    previous = None
    for role, content in turns:
        opener = np.array([s.role(role)], np.int32)
        body = tokenizer.encode(content)
        pieces += [opener, body]
        # The opener closes the previous turn: trained on if that turn was the assistant's.
        flags += [np.array([previous == "assistant"]), np.full(body.shape, role == "assistant")]
        previous = role
    pieces.append(np.array([s.eos], np.int32))
    flags.append(np.array([previous == "assistant"]))
    return np.concatenate(pieces), np.concatenate(flags)


class CropCounter:
    """Counts and logs documents cropped to the maximum length (thread safe: grain reads in
    threads). Not part of the iterator state: a resumed run counts from zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.tokens_removed = 0

    def record(self, where: str, length: int, max_len: int) -> None:
        with self._lock:
            self.count += 1
            self.tokens_removed += length - max_len
            first = self.count == 1
        # The first crop is a warning (the data holds documents longer than max_doc_len); the
        # rest are counted (the training metrics' cropped_docs) and logged at INFO.
        (logging.warning if first else logging.info)(
            "cropped %s from %d to %d tokens (keeping the tail)%s", where, length, max_len,
            "; further crops are counted (cropped_docs, cropped_tokens)" if first else "")


def crop_document(doc: Document, max_len: int, counter: CropCounter | None = None,
                  where: str = "document") -> Document:
    """`doc` cut to its last `max_len` tokens, counted; unchanged if it already fits.

    The tail is kept because the supervised part of a conversation or task (the final answer)
    sits at the end; for plain text either end is equally good.
    """
    n = len(doc["inputs"])
    if n <= max_len:
        return doc
    if counter is not None:
        counter.record(where, n, max_len)
    return {k: v[n - max_len:] for k, v in doc.items()}


def validate_document(doc: Document) -> int:
    """Checks the record contract; returns the document's length n."""
    if set(doc) != set(DOCUMENT_KEYS):
        raise ValueError(f"document keys {sorted(doc)} != {sorted(DOCUMENT_KEYS)}")
    n = len(doc["inputs"])
    dtypes = {"inputs": np.int32, "targets": np.int32, "loss_mask": np.float32}
    for key, dtype in dtypes.items():
        value = doc[key]
        if value.ndim != 1 or value.shape[0] != n or value.dtype != dtype:
            raise ValueError(f"document[{key!r}] is {value.dtype}{list(value.shape)}, "
                             f"expected {np.dtype(dtype)}[{n}]")
    if n == 0:
        raise ValueError("empty document")
    return n
