"""LongBench answer metrics, computed as LongBench's own scorer computes them.

Each metric reproduces LongBench's `metrics.py` (THUDM/LongBench, commit f6227eb; unchanged in
behaviour since) with the libraries it uses, so a prediction scores as LongBench scores it (the
prompts, though, are longbench.py's own wording: a task's score is not one measured with
LongBench's prompts):
`rouge` for ROUGE-L, `jieba` to cut Chinese into words, `rapidfuzz` for code edit similarity
(the ratio LongBench takes from fuzzywuzzy over python-Levenshtein). They are imported on first
use, so a run that scores no LongBench task does not need them. Every metric maps (prediction,
gold answer) to a score in [0, 1]. `score_predictions` applies LongBench's aggregation rules
(its `eval.py`) on top: the best score over all gold answers of an example, only the first line
of the prediction for the tasks whose answers are one line (trec, triviaqa, samsum, lsht), and
100 x the mean over examples, rounded to 2 decimals.

- qa_f1: bag-of-words F1 after lowercasing, removing ASCII punctuation (`string.punctuation`;
  curly quotes and dashes stay) and the articles a/an/the, and collapsing whitespace.
- qa_f1_zh: bag-of-words F1 over jieba words, each lowercased with ASCII and common CJK
  punctuation and all whitespace removed; words left empty are dropped.
- rouge_l: the `rouge` package's summary-level ROUGE-L F: sentences split at ".", words at
  spaces, case and other punctuation kept, union LCS over distinct words. A pair the package
  cannot score counts 0. rouge_l_zh: the same on jieba words joined by spaces.
- classification: 1 / (number of class names found in the prediction) if the gold class is
  among them.
- retrieval, retrieval_zh, count: the fraction of the numbers in the prediction equal to the
  gold paragraph number or count.
- code_sim: `fuzz.ratio` (2 x LCS / total length, in whole percent) of the prediction's first
  code line with the gold line.
"""

from __future__ import annotations

import collections
import logging
import re
import string
from typing import Callable, Sequence

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_NUMBER_RE = re.compile(r"\d+")
_EN_PUNCT = frozenset(string.punctuation)
# LongBench's list of Chinese punctuation, removed with string.punctuation from Chinese answers.
_ZH_PUNCT = _EN_PUNCT | frozenset(
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿"
    "｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟"
    "〰〾〿–—‘’‛“”„‟…‧﹏.")


def normalize_en(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _EN_PUNCT)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def normalize_zh(text: str) -> str:
    return "".join("".join(ch for ch in text.lower() if ch not in _ZH_PUNCT).split())


def _jieba_words(text: str) -> list[str]:
    import jieba

    # jieba loads its dictionary on the first cut and logs four lines about it.
    jieba.setLogLevel(logging.WARNING)
    return jieba.lcut(text, cut_all=False)


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


def _zh_words(text: str) -> list[str]:
    return [w for w in map(normalize_zh, _jieba_words(text)) if w]


def qa_f1_zh(prediction: str, gold: str) -> float:
    """Bag-of-words F1 between the normalised jieba words of a Chinese prediction and gold."""
    return _token_f1(_zh_words(prediction), _zh_words(gold))


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F of the `rouge` package (summary level, sentences split at ".")."""
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [gold], avg=True)
    except (ValueError, RecursionError):
        # LongBench scores 0 where the package raises: ValueError for a text with no sentence
        # (empty, or only "."), RecursionError from its recursive LCS once a sentence pair
        # runs to about 1000 words.
        return 0.0
    return scores["rouge-l"]["f"]


def rouge_l_zh(prediction: str, gold: str) -> float:
    """`rouge_l` on the jieba words of a Chinese prediction and gold, joined by spaces."""
    return rouge_l(" ".join(_jieba_words(prediction)), " ".join(_jieba_words(gold)))


def classification(prediction: str, gold: str, all_classes: Sequence[str]) -> float:
    """1 / (number of class names found in the prediction) if the gold class is among them.

    A class name inside the gold class is dropped from the matches, since writing the gold
    class out finds it too.
    """
    if not all_classes:
        raise ValueError("classification needs all_classes (the task's label set), got none")
    matched = [c for c in all_classes if c in prediction]
    # LongBench's own loop, kept for identical scores: removing from the list it iterates skips
    # the entry after each removal (classes a, b, ab with gold "ab" written out score 1/2).
    for c in matched:
        if c in gold and c != gold:
            matched.remove(c)
    if gold not in matched:
        return 0.0
    return 1.0 / len(matched)


def _retrieval(prediction: str, gold: str, pattern: str) -> float:
    found = re.findall(pattern, gold)
    if not found:
        raise ValueError(f"retrieval gold answer {gold!r} does not match {pattern!r}")
    return count(prediction, found[0])


def retrieval(prediction: str, gold: str) -> float:
    """Fraction of the numbers in the prediction equal to the gold 'Paragraph N'."""
    return _retrieval(prediction, gold, r"Paragraph (\d+)")


def retrieval_zh(prediction: str, gold: str) -> float:
    """Fraction of the numbers in the prediction equal to the gold '段落N'."""
    return _retrieval(prediction, gold, r"段落(\d+)")


def count(prediction: str, gold: str) -> float:
    """Fraction of the numbers in the prediction equal to the gold count (compared as text)."""
    numbers = _NUMBER_RE.findall(prediction)
    if not numbers:
        return 0.0
    return sum(n == gold for n in numbers) / len(numbers)


def edit_similarity(a: str, b: str) -> float:
    """LongBench's `fuzz.ratio(a, b) / 100` (fuzzywuzzy over python-Levenshtein): the indel
    similarity 2 x LCS / (len(a) + len(b)), rounded to a whole percent. rapidfuzz computes the
    same ratio (python-Levenshtein is built on it); fuzzywuzzy's rounding is Python's round."""
    from rapidfuzz import fuzz

    return round(fuzz.ratio(a, b)) / 100


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
