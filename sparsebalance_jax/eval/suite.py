"""The synthetic long-context suite: a fixed grid of (task, length) cells, and its scoring.

Each example is drawn with its own generator seeded by (seed, task, length, index), so an
item never depends on which other cells or how many examples were asked for, and the
same seed gives the same suite on every machine. Scoring is exact match after
normalisation (`normalize_answer`): case, punctuation and spacing are ignored, every
word and number must match in order.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from sparsebalance_jax.data import synthetic

_NON_WORD_RE = re.compile(r"[\W_]+")  # Unicode-aware: letters of any script are words


@dataclasses.dataclass(frozen=True)
class SuiteItem:
    task: str
    target_chars: int  # the length cell this item belongs to
    index: int  # position within its cell
    example: synthetic.SyntheticExample


def build_suite(
    haystack: Sequence[str],
    *,
    seed: int,
    lengths: Sequence[int],
    per_cell: int,
    tasks: Sequence[str] = synthetic.TASKS,
) -> list[SuiteItem]:
    """`per_cell` examples for every (task, length), ordered by task, then length."""
    if per_cell < 1:
        raise ValueError(f"per_cell must be >= 1, got {per_cell}")
    if not lengths:
        raise ValueError("lengths is empty: give at least one target length in characters")
    items = []
    for task in tasks:
        if task not in synthetic.TASKS:
            raise ValueError(f"unknown synthetic task {task!r}; known: {list(synthetic.TASKS)}")
        task_id = synthetic.TASKS.index(task)
        for length in lengths:
            for i in range(per_cell):
                rng = np.random.default_rng([seed, task_id, int(length), i])
                example = synthetic.generate(task, rng, haystack, int(length))
                items.append(SuiteItem(task, int(length), i, example))
    return items


def normalize_answer(text: str) -> str:
    """Case-folded words and numbers (of any script) separated by single spaces; punctuation
    and spacing dropped. A letter outside ASCII is part of a word, not a separator: "1234567é"
    is not "1234567"."""
    return " ".join(_NON_WORD_RE.split(text.casefold())).strip()


def exact_match(prediction: str, answer: str) -> bool:
    """Whether the first line of a prediction equals the answer after normalisation.

    Only the first line counts: a decoded continuation may run on past the answer.
    """
    first_line = prediction.lstrip().split("\n", 1)[0]
    return normalize_answer(first_line) == normalize_answer(answer)


def score_predictions(items: Sequence[SuiteItem], predictions: Sequence[str]) -> list[bool]:
    if len(items) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions for {len(items)} suite items")
    return [exact_match(p, it.example.answer) for p, it in zip(predictions, items)]
