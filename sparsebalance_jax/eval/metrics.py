"""LongBench answer metrics: one function per metric, plus the per-task scoring rules.

Every metric maps (prediction, gold answer) to a score in [0, 1]. `score_predictions`
applies LongBench's aggregation rules on top: the best score over all gold answers
of an example, only the first line of the prediction for the tasks whose answers
are one line (trec, triviaqa, samsum, lsht), and 100 x the mean over examples.

Text normalisation:
- English: lowercase, punctuation removed, the articles a/an/the removed,
  whitespace collapsed; tokens are the remaining words.
- Chinese: lowercase, punctuation (ASCII and CJK) and whitespace removed; tokens are
  single characters (no word segmenter is needed, and character F1 is stable).
"""

from __future__ import annotations

import collections
import re
import string
import unicodedata
from typing import Callable, Sequence

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_NUMBER_RE = re.compile(r"\d+")
_ASCII_PUNCT = frozenset(string.punctuation)


def _is_punct(ch: str) -> bool:
    # Unicode category P* covers CJK punctuation (，。《》 ...); ASCII symbols like $ or ~
    # are category S but LongBench-style normalisation strips them too.
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_en(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def normalize_zh(text: str) -> str:
    text = text.lower()
    return "".join(ch for ch in text if not _is_punct(ch) and not ch.isspace())


def _token_f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, gold: str) -> float:
    """Bag-of-words F1 between normalised English prediction and gold."""
    return _token_f1(normalize_en(prediction).split(), normalize_en(gold).split())


def qa_f1_zh(prediction: str, gold: str) -> float:
    """Bag-of-characters F1 between normalised Chinese prediction and gold."""
    return _token_f1(list(normalize_zh(prediction)), list(normalize_zh(gold)))


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    # One row of the DP table over the shorter sequence: O(len(a) * len(b)) time,
    # O(len(b)) memory, enough for 512-token summaries.
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def _lcs_f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return 0.0
    lcs = _lcs_length(pred_tokens, gold_tokens)
    if lcs == 0:
        return 0.0
    precision = lcs / len(pred_tokens)
    recall = lcs / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _rouge_tokens_en(text: str) -> list[str]:
    # Words only: punctuation would otherwise count as matching tokens. Articles stay
    # (ROUGE measures fluency of a summary, unlike QA F1).
    return re.findall(r"\w+", text.lower())


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F1 (beta = 1): LCS over lowercase English word tokens."""
    return _lcs_f1(_rouge_tokens_en(prediction), _rouge_tokens_en(gold))


def rouge_l_zh(prediction: str, gold: str) -> float:
    """ROUGE-L F1 (beta = 1) over the characters of the normalised Chinese text."""
    return _lcs_f1(list(normalize_zh(prediction)), list(normalize_zh(gold)))


def classification(prediction: str, gold: str, all_classes: Sequence[str]) -> float:
    """1 / (number of class names found in the prediction) if the gold class is among them.

    A class name that is a strict substring of the gold class is not counted as a
    separate match: it is found whenever the gold class is written out.
    """
    if not all_classes:
        raise ValueError("classification needs all_classes (the task's label set), got none")
    matched = [c for c in all_classes if c in prediction]
    matched = [c for c in matched if not (c in gold and c != gold)]
    if gold not in matched:
        return 0.0
    return 1.0 / len(matched)


def _retrieval(prediction: str, gold: str, pattern: str) -> float:
    found = re.findall(pattern, gold)
    if not found:
        raise ValueError(f"retrieval gold answer {gold!r} does not match {pattern!r}")
    target = found[0]
    numbers = _NUMBER_RE.findall(prediction)
    if not numbers:
        return 0.0
    return sum(n == target for n in numbers) / len(numbers)


def retrieval(prediction: str, gold: str) -> float:
    """Fraction of the numbers in the prediction equal to the gold 'Paragraph N'."""
    return _retrieval(prediction, gold, r"Paragraph (\d+)")


def retrieval_zh(prediction: str, gold: str) -> float:
    """Fraction of the numbers in the prediction equal to the gold '段落N'."""
    return _retrieval(prediction, gold, r"段落(\d+)")


def count(prediction: str, gold: str) -> float:
    """Fraction of the numbers in the prediction equal to the gold count."""
    numbers = _NUMBER_RE.findall(prediction)
    if not numbers:
        return 0.0
    return sum(n == str(gold).strip() for n in numbers) / len(numbers)


def edit_similarity(a: str, b: str) -> float:
    """1 - insert/delete distance / (len(a) + len(b)), i.e. 2 * LCS / (len(a) + len(b))."""
    if not a and not b:
        return 1.0
    return 2 * _lcs_length(a, b) / (len(a) + len(b))


def code_sim(prediction: str, gold: str) -> float:
    """Edit similarity of the first real code line of the prediction with the gold line.

    Lines holding a markdown fence or a comment marker are skipped: models often open
    with ``` or an explanation in a comment before the completion itself.
    """
    first_line = ""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            first_line = line
            break
    return edit_similarity(first_line, gold)


MetricFn = Callable[..., float]

METRICS: dict[str, MetricFn] = {
    "qa_f1": qa_f1,
    "qa_f1_zh": qa_f1_zh,
    "rouge_l": rouge_l,
    "rouge_l_zh": rouge_l_zh,
    "classification": classification,
    "retrieval": retrieval,
    "retrieval_zh": retrieval_zh,
    "count": count,
    "code_sim": code_sim,
}

# Tasks whose predictions are cut to their first line before scoring: their answers are
# one line, and few-shot prompts invite the model to continue with the next example.
FIRST_LINE_TASKS = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def score_example(
    metric: str,
    prediction: str,
    golds: Sequence[str],
    *,
    task: str,
    all_classes: Sequence[str] | None = None,
) -> float:
    """Best score of one prediction over its gold answers, in [0, 1]."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {sorted(METRICS)}")
    if not golds:
        raise ValueError(f"task {task!r}: example has no gold answers")
    if task in FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    fn = METRICS[metric]
    if metric == "classification":
        return max(fn(prediction, g, all_classes or ()) for g in golds)
    return max(fn(prediction, g) for g in golds)


def score_predictions(
    metric: str,
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    *,
    task: str,
    all_classes: Sequence[Sequence[str] | None] | None = None,
) -> float:
    """LongBench task score: 100 x mean of per-example best scores, rounded to 2 decimals."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} examples")
    if not predictions:
        raise ValueError(f"task {task!r}: no predictions to score")
    classes = all_classes if all_classes is not None else [None] * len(predictions)
    total = sum(
        score_example(metric, p, g, task=task, all_classes=c)
        for p, g, c in zip(predictions, golds, classes, strict=True)
    )
    return round(100.0 * total / len(predictions), 2)
