"""Synthetic long-context tasks: facts hidden in real text, a question at the end.

One generator serves both the training mixture and the evaluation suite:
`generate(task, rng, haystack, target_chars)` fills about `target_chars` characters
(prompt + answer; the byte-level tokenizer makes that about as many tokens) with
paragraphs from `haystack`, inserts the task's facts at random sentence boundaries,
and ends with the question. Everything random comes from `rng`, so an example is a
pure function of the generator state.

Tasks (answers are short so that exact match is a fair score):
- needle: one "special magic number" for a key; answer the number.
- multikey: four keys with their numbers; answer the number of one of them.
- multivalue: four numbers for one key; answer all four in order of appearance.
- vartrack: two chains of variable assignments (VAR B = VAR A ...); answer every
  variable that ends up holding the queried value, in assignment order.
- commonwords: "Listed words" lines scattered in the text; answer the three words
  that occur most often, alphabetically.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

TASKS = ("needle", "multikey", "multivalue", "vartrack", "commonwords")

_HEADER = (
    "Some facts are hidden in the text below. Read all of it, then answer the question "
    "at the end.\n\n"
)

_ADJECTIVES = (
    "amber", "brave", "calm", "clever", "crimson", "dusty", "eager", "faint", "gentle",
    "golden", "hollow", "humble", "icy", "jolly", "keen", "lively", "lucky", "misty",
    "noble", "odd", "pale", "proud", "quiet", "rapid", "rusty", "silent", "silver",
    "sleepy", "smooth", "steady", "swift", "tidy", "vivid", "wary", "wild", "witty",
)
_NOUNS = (
    "anchor", "apple", "badger", "banner", "barrel", "beacon", "bridge", "candle",
    "canyon", "castle", "cedar", "comet", "copper", "desert", "dragon", "falcon",
    "feather", "forest", "garden", "glacier", "harbor", "helmet", "island", "jungle",
    "kettle", "lantern", "ledger", "meadow", "mirror", "needle", "orchard", "otter",
    "pebble", "pepper", "pillow", "planet", "puzzle", "quarry", "rabbit", "ribbon",
    "river", "saddle", "shadow", "spider", "stone", "summit", "thunder", "tiger",
    "tower", "tunnel", "valley", "violin", "wagon", "walnut", "willow", "window",
)

_NUM_KEYS = 4  # multikey: queried key plus three distractor keys
_NUM_VALUES = 4  # multivalue: numbers listed for the one key
_CHAIN_HOPS = 4  # vartrack: variables per chain (two chains: answer + distractor)
_NUM_COMMON = 3  # commonwords: words to report
_COMMON_FREQ = 6  # commonwords: occurrences of each common word
_NUM_RARE = 9  # commonwords: distractor words, each occurring 1 or 2 times
_WORDS_PER_LINE = 6


@dataclasses.dataclass(frozen=True)
class SyntheticExample:
    """A prompt ending in its question, and the short answer that should follow it.

    `fact_offsets` are the character offsets of the inserted facts in `prompt`, in
    order of appearance (they let tests and depth analyses find the facts).
    """

    prompt: str
    answer: str
    task: str
    fact_offsets: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Parts:
    facts: tuple[str, ...]  # inserted in this order
    question: str
    answer: str


def _magic_number(rng: np.random.Generator) -> int:
    return int(rng.integers(1_000_000, 10_000_000))


def _keys(rng: np.random.Generator, n: int) -> list[str]:
    pairs = set()
    while len(pairs) < n:
        pairs.add((str(rng.choice(_ADJECTIVES)), str(rng.choice(_NOUNS))))
    # Sets are unordered: sort, then shuffle with rng, so the result depends on rng only.
    ordered = sorted(pairs)
    rng.shuffle(ordered)
    return [f"{a}-{b}" for a, b in ordered]


def _needle_fact(key: str, value: int) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _needle(rng: np.random.Generator) -> _Parts:
    (key,) = _keys(rng, 1)
    value = _magic_number(rng)
    return _Parts(
        facts=(_needle_fact(key, value),),
        question=f"What is the special magic number for {key} mentioned in the text?",
        answer=str(value),
    )


def _multikey(rng: np.random.Generator) -> _Parts:
    keys = _keys(rng, _NUM_KEYS)
    values = [_magic_number(rng) for _ in keys]
    target = int(rng.integers(len(keys)))
    return _Parts(
        facts=tuple(_needle_fact(k, v) for k, v in zip(keys, values)),
        question=f"What is the special magic number for {keys[target]} mentioned in the text?",
        answer=str(values[target]),
    )


def _multivalue(rng: np.random.Generator) -> _Parts:
    (key,) = _keys(rng, 1)
    values = []
    while len(values) < _NUM_VALUES:
        v = _magic_number(rng)
        if v not in values:
            values.append(v)
    return _Parts(
        facts=tuple(_needle_fact(key, v) for v in values),
        question=(
            f"What are all the special magic numbers for {key} mentioned in the text? "
            "List them in the order they appear, separated by commas."
        ),
        answer=", ".join(str(v) for v in values),
    )


def _variable_names(rng: np.random.Generator, n: int) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(chr(ord("A") + int(i)) for i in rng.integers(0, 26, size=5))
        if name not in names:
            names.append(name)
    return names


def _vartrack(rng: np.random.Generator) -> _Parts:
    names = _variable_names(rng, 2 * _CHAIN_HOPS)
    value = int(rng.integers(10_000, 100_000))
    distractor_value = value
    while distractor_value == value:
        distractor_value = int(rng.integers(10_000, 100_000))
    chains = []
    for chain_names, v in ((names[:_CHAIN_HOPS], value), (names[_CHAIN_HOPS:], distractor_value)):
        lines = [f"VAR {chain_names[0]} = {v}."]
        lines += [f"VAR {b} = VAR {a}." for a, b in zip(chain_names, chain_names[1:])]
        chains.append(lines)
    # Interleave the two chains at random, keeping each chain's own order (an
    # assignment must follow the one it copies).
    which = np.array([0] * _CHAIN_HOPS + [1] * _CHAIN_HOPS)
    rng.shuffle(which)
    cursors = [0, 0]
    facts = []
    for c in which:
        facts.append(chains[c][cursors[c]])
        cursors[c] += 1
    return _Parts(
        facts=tuple(facts),
        question=(
            f"Which variables are assigned the value {value}, directly or through other "
            "variables? List them in the order they are assigned, separated by commas."
        ),
        answer=", ".join(names[:_CHAIN_HOPS]),
    )


def _commonwords(rng: np.random.Generator) -> _Parts:
    chosen = [str(w) for w in rng.choice(_NOUNS, size=_NUM_COMMON + _NUM_RARE, replace=False)]
    common, rare = chosen[:_NUM_COMMON], chosen[_NUM_COMMON:]
    words = [w for w in common for _ in range(_COMMON_FREQ)]
    words += [w for w in rare for _ in range(int(rng.integers(1, 3)))]
    rng.shuffle(words)
    lines = tuple(
        "Listed words: " + ", ".join(words[i : i + _WORDS_PER_LINE]) + "."
        for i in range(0, len(words), _WORDS_PER_LINE)
    )
    return _Parts(
        facts=lines,
        question=(
            f"Which {_NUM_COMMON} words occur most often across all the 'Listed words' "
            "lines? Give them in alphabetical order, separated by commas."
        ),
        answer=", ".join(sorted(common)),
    )


_BUILDERS = {
    "needle": _needle,
    "multikey": _multikey,
    "multivalue": _multivalue,
    "vartrack": _vartrack,
    "commonwords": _commonwords,
}


def _filler(rng: np.random.Generator, haystack: Sequence[str], n_chars: int) -> str:
    """About n_chars of consecutive haystack paragraphs from a random start, cut at a space."""
    if n_chars <= 0:
        return ""
    pieces, total = [], 0
    start = int(rng.integers(len(haystack)))
    i = start
    while total < n_chars:
        para = " ".join(haystack[i % len(haystack)].split())
        if para:
            pieces.append(para)
            total += len(para) + 1
        i += 1
        if i - start >= len(haystack) and total == 0:
            raise ValueError("haystack holds only empty strings")
    text = " ".join(pieces)[:n_chars]
    cut = text.rfind(" ")
    return text[:cut] if cut > 0 else text


def _sentence_boundaries(text: str) -> list[int]:
    """Offsets where a sentence starts. The filler's end counts only if it ends a
    sentence: it is usually cut mid-sentence, and a fact there would split it."""
    bounds = [0]
    pos = text.find(". ")
    while pos != -1:
        bounds.append(pos + 2)
        pos = text.find(". ", pos + 2)
    if text.endswith("."):
        bounds.append(len(text))
    return bounds


def _question_block(question: str) -> str:
    return f"\n\nQuestion: {question}\nAnswer: "


def _fixed_chars(parts: _Parts) -> int:
    # Each fact takes a trailing space and at most one separating space before it.
    facts = sum(len(f) + 2 for f in parts.facts)
    return len(_HEADER) + facts + len(_question_block(parts.question)) + len(parts.answer)


def min_target_chars(task: str) -> int:
    """The target_chars that `generate` needs at least for `task`, at seed 0 (no filler);
    other draws differ by a few characters (key and word lengths vary)."""
    return _fixed_chars(_BUILDERS[_check_task(task)](np.random.default_rng(0)))


def _check_task(task: str) -> str:
    if task not in _BUILDERS:
        raise ValueError(f"unknown synthetic task {task!r}; known: {list(TASKS)}")
    return task


def generate(
    task: str, rng: np.random.Generator, haystack: Sequence[str], target_chars: int
) -> SyntheticExample:
    """One example of `task` with len(prompt) + len(answer) close to target_chars.

    The length never exceeds the target and lands a few characters below it (filler is cut at a word
    boundary). Raises ValueError for an unknown task, an empty haystack, or a target
    too short to hold the task's facts and question.
    """
    parts = _BUILDERS[_check_task(task)](rng)
    if not haystack:
        raise ValueError("haystack is empty: pass a list of text paragraphs")
    fixed = _fixed_chars(parts)
    if target_chars < fixed:
        raise ValueError(
            f"target_chars={target_chars} is too short for task {task!r}: its facts, "
            f"question and answer alone take {fixed} characters"
        )
    filler = _filler(rng, haystack, target_chars - fixed)
    bounds = _sentence_boundaries(filler)
    # Sorted positions keep facts in their given order (vartrack chains and the
    # multivalue answer depend on it); equal positions stack facts together.
    positions = np.sort(rng.choice(bounds, size=len(parts.facts), replace=True))

    out, offsets, prev = [_HEADER], [], 0
    length = len(_HEADER)
    for fact, pos in zip(parts.facts, positions):
        chunk = filler[prev:pos]
        out.append(chunk)
        length += len(chunk)
        # A fact at the very end of a sentence-less chunk needs a separating space.
        sep = " " if chunk and not chunk.endswith(" ") else ""
        out.append(sep)
        length += len(sep)
        offsets.append(length)
        out.append(fact + " ")
        length += len(fact) + 1
        prev = int(pos)
    out.append(filler[prev:].rstrip())
    out.append(_question_block(parts.question))
    return SyntheticExample(
        prompt="".join(out), answer=parts.answer, task=task, fact_offsets=tuple(offsets)
    )
