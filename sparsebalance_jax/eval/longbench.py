"""LongBench data: task table (prompt template, answer length, metric), jsonl loader,
LongBench-E length buckets, and prompt construction with middle truncation.

Nothing is downloaded: the loader reads LongBench's own jsonl files (one example per
line, fields `input, context, answers, length, dataset, language, all_classes, _id`)
from a local directory, named `<task>.jsonl` (LongBench) or `<task>_e.jsonl`
(LongBench-E). The prompt templates are this project's wording; they keep
LongBench's structure (instruction, context, question, answer cue) per task family.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Sequence

from sparsebalance_jax.eval import metrics


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """How one LongBench task is prompted and scored."""

    name: str
    metric: str  # a key of metrics.METRICS
    max_new_tokens: int  # LongBench's answer budget, in its models' tokens (answer_budget)
    template: str  # str.format template with {context} and {input}


# Shared wording per task family; each names only the fields it uses.
_QA_DOC = (
    "Read the document below and answer the question as briefly as you can, using only "
    "the document. If the question cannot be answered from it, write \"unanswerable\".\n\n"
    "Document:\n{context}\n\n"
    "Answer the question briefly; do not explain.\n\nQuestion: {input}\nAnswer:"
)
_QA_STORY = (
    "Here is a story. Answer the question about it in as few words as possible.\n\n"
    "Story:\n{context}\n\n"
    "Answer in as few words as possible; do not explain.\n\nQuestion: {input}\nAnswer:"
)
_QA_MULTI_EN = (
    "Several passages follow. Use them to answer the question; reply with the answer "
    "only.\n\nPassages:\n{context}\n\n"
    "Reply with the answer only.\n\nQuestion: {input}\nAnswer:"
)
_QA_SINGLE_EN = (
    "Read the text below and answer the question with a short answer.\n\n"
    "Text:\n{context}\n\n"
    "Give a short answer only.\n\nQuestion: {input}\nAnswer:"
)
_QA_ZH = (
    "阅读下面的文章，并简要回答问题，只输出答案。\n\n文章：\n{context}\n\n"
    "请只输出答案，不要解释。\n\n问题：{input}\n回答："
)
_DUREADER = (
    "请根据下面的多篇文档回答问题，答案要简明扼要。\n\n文档：\n{context}\n\n"
    "问题：{input}\n回答："
)
_SUMMARY_REPORT = (
    "Below is a government report. Summarise it in a few paragraphs.\n\n"
    "Report:\n{context}\n\nSummary:"
)
_SUMMARY_MEETING = (
    "Below is a meeting transcript, followed by a query about it. Answer the query in "
    "one or more sentences.\n\nTranscript:\n{context}\n\n"
    "Query: {input}\nAnswer:"
)
_SUMMARY_NEWS = (
    "Several news articles follow. Write one summary covering all of them.\n\n"
    "Articles:\n{context}\n\nSummary:"
)
_VCSUM = "下面是一段会议记录，请写一段总结。\n\n会议记录：\n{context}\n\n会议总结："
_TREC = (
    "Classify the type of answer each question asks for. Labelled examples:\n\n"
    "{context}\n{input}"
)
_TRIVIAQA = (
    "Answer the question with a short phrase, as in these examples.\n\n{context}\n\n{input}"
)
_SAMSUM = "Summarise each dialogue in one sentence, as in these examples.\n\n{context}\n\n{input}"
_LSHT = "请判断下面新闻的类别，格式同以下示例。\n\n{context}\n{input}"
_PASSAGE_COUNT = (
    "Below are many paragraphs; some are repeated. How many different paragraphs are "
    "there?\n\n{context}\n\n"
    "Reply with one number: the count of different paragraphs.\n\nThe number is:"
)
_PASSAGE_RETRIEVAL_EN = (
    "Below are 30 numbered paragraphs and then a summary. Which paragraph is the "
    "summary about?\n\n{context}\n\nSummary:\n{input}\n\n"
    'Reply in the form "Paragraph N".\n\nThe answer is:'
)
_PASSAGE_RETRIEVAL_ZH = (
    "下面是30个编号的段落和一段摘要。摘要出自哪个段落？\n\n{context}\n\n摘要：\n{input}\n\n"
    "请用\u201c段落N\u201d的格式回答。\n\n答案是："
)
_LCC = "Continue the following code with its next line.\n\n{context}"
_REPOBENCH = (
    "Continue the following code with its next line; earlier files of the repository "
    "come first.\n\n{context}{input}"
)

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("narrativeqa", "qa_f1", 128, _QA_STORY),
        TaskSpec("qasper", "qa_f1", 128, _QA_DOC),
        TaskSpec("multifieldqa_en", "qa_f1", 64, _QA_SINGLE_EN),
        TaskSpec("multifieldqa_zh", "qa_f1_zh", 64, _QA_ZH),
        TaskSpec("hotpotqa", "qa_f1", 32, _QA_MULTI_EN),
        TaskSpec("2wikimqa", "qa_f1", 32, _QA_MULTI_EN),
        TaskSpec("musique", "qa_f1", 32, _QA_MULTI_EN),
        TaskSpec("dureader", "rouge_l_zh", 128, _DUREADER),
        TaskSpec("gov_report", "rouge_l", 512, _SUMMARY_REPORT),
        TaskSpec("qmsum", "rouge_l", 512, _SUMMARY_MEETING),
        TaskSpec("multi_news", "rouge_l", 512, _SUMMARY_NEWS),
        TaskSpec("vcsum", "rouge_l_zh", 512, _VCSUM),
        TaskSpec("trec", "classification", 64, _TREC),
        TaskSpec("triviaqa", "qa_f1", 32, _TRIVIAQA),
        TaskSpec("samsum", "rouge_l", 128, _SAMSUM),
        TaskSpec("lsht", "classification", 64, _LSHT),
        TaskSpec("passage_count", "count", 32, _PASSAGE_COUNT),
        TaskSpec("passage_retrieval_en", "retrieval", 32, _PASSAGE_RETRIEVAL_EN),
        TaskSpec("passage_retrieval_zh", "retrieval_zh", 32, _PASSAGE_RETRIEVAL_ZH),
        TaskSpec("lcc", "code_sim", 64, _LCC),
        TaskSpec("repobench-p", "code_sim", 64, _REPOBENCH),
    )
}

# The Chinese tasks (their answers are scored on jieba's words, metrics.py).
ZH_TASKS = frozenset({"multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"})
# Bytes per token of LongBench's budgets (its models' BPE tokens): English text runs about 4
# characters, one byte each, a token; Chinese about 1.5 characters, three bytes each.
_BYTES_PER_TOKEN = {"en": 4.0, "zh": 4.5}


def answer_budget(task: str, tokenizer_kind: str) -> int:
    """The most ids an answer to `task` may take in the tokenizer's ids: LongBench's
    max_new_tokens, counted in its models' tokens, converted (the byte tokenizer's ids are
    bytes, ~4x as many as such tokens: taken as they are, the budget would cut answers a
    quarter of the way)."""
    tokens = TASKS[task].max_new_tokens
    if tokenizer_kind != "bytes":
        raise ValueError(f"no LongBench answer budget for tokenizer {tokenizer_kind!r}; "
                         "only 'bytes' is known")
    per_token = _BYTES_PER_TOKEN["zh" if task in ZH_TASKS else "en"]
    return int(-(-tokens * per_token // 1))


# The tasks that LongBench-E ships (a length-balanced subset).
LONGBENCH_E_TASKS = (
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news",
    "trec", "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc",
    "repobench-p",
)

# LongBench-E buckets over the `length` field (words for English, characters for
# Chinese): [lo, hi) with hi=None for the open top bucket.
LENGTH_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("0-4k", 0, 4000),
    ("4-8k", 4000, 8000),
    ("8k+", 8000, None),
)

_REQUIRED_FIELDS = (
    "input", "context", "answers", "length", "dataset", "language", "all_classes", "_id",
)


@dataclasses.dataclass(frozen=True)
class LongBenchExample:
    input: str
    context: str
    answers: tuple[str, ...]
    length: int
    dataset: str
    language: str
    all_classes: tuple[str, ...] | None
    id: str


def length_bucket(length: int) -> str:
    for name, lo, hi in LENGTH_BUCKETS:
        if length >= lo and (hi is None or length < hi):
            return name
    raise ValueError(f"negative example length {length}")


def task_path(
    data_dir: str | pathlib.Path, task: str, *, longbench_e: bool = False
) -> pathlib.Path:
    if task not in TASKS:
        raise ValueError(f"unknown LongBench task {task!r}; known: {sorted(TASKS)}")
    return pathlib.Path(data_dir) / (f"{task}_e.jsonl" if longbench_e else f"{task}.jsonl")


def _parse_line(line: str, where: str, task: str, longbench_e: bool) -> LongBenchExample:
    """One example; its `dataset` is the task's name (LongBench-E rows may carry the name with
    its "_e" suffix, as their files do)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from e
    missing = [f for f in _REQUIRED_FIELDS if f not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    answers = row["answers"]
    if not isinstance(answers, list) or not answers:
        raise ValueError(f"{where}: field 'answers' must be a non-empty list, got {answers!r}")
    expected = (task, f"{task}_e") if longbench_e else (task,)
    if row["dataset"] not in expected:
        raise ValueError(f"{where}: field 'dataset' is {row['dataset']!r}, expected "
                         + " or ".join(map(repr, expected)))
    classes = row["all_classes"]
    return LongBenchExample(
        input=row["input"],
        context=row["context"],
        answers=tuple(str(a) for a in answers),
        length=int(row["length"]),
        dataset=task,
        language=row["language"],
        all_classes=None if classes is None else tuple(classes),
        id=str(row["_id"]),
    )


def load_task(
    data_dir: str | pathlib.Path, task: str, *, longbench_e: bool = False
) -> list[LongBenchExample]:
    """All examples of one task; FileNotFoundError naming the expected path if absent."""
    path = task_path(data_dir, task, longbench_e=longbench_e)
    if not path.is_file():
        raise FileNotFoundError(
            f"LongBench task file for {task!r} not found: {path} "
            f"(expected LongBench's jsonl, one example per line)"
        )
    examples = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                examples.append(_parse_line(line, f"{path}:{lineno}", task, longbench_e))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def build_prompt(example: LongBenchExample) -> str:
    return TASKS[example.dataset].template.format(context=example.context, input=example.input)


def truncate_middle(ids: Sequence[int], max_len: int) -> list[int]:
    """Keep the first and last max_len/2 tokens of a whole formatted prompt.

    This is LongBench's own convention (its pred.py), kept so that scores compare with
    LongBench's: the instruction and the question sit at the two ends of the prompt, so the
    cut usually falls in the context, but a question longer than max_len/2 loses its start.
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    ids = list(ids)
    if len(ids) <= max_len:
        return ids
    half = max_len // 2  # pred.py's int(max_length / 2) from each end: an odd max_len keeps
    return ids[:half] + ids[len(ids) - half:]  # one token less


def score_task(
    task: str, examples: Sequence[LongBenchExample], predictions: Sequence[str]
) -> dict[str, float]:
    """Task score overall and per LongBench-E length bucket (buckets with no example are
    left out), each 100 x mean of per-example best scores."""
    spec = TASKS[task]
    golds = [e.answers for e in examples]
    classes = [e.all_classes for e in examples]
    result = {
        "all": metrics.score_predictions(
            spec.metric, predictions, golds, task=task, all_classes=classes
        )
    }
    for name, _, _ in LENGTH_BUCKETS:
        idx = [i for i, e in enumerate(examples) if length_bucket(e.length) == name]
        if idx:
            result[name] = metrics.score_predictions(
                spec.metric,
                [predictions[i] for i in idx],
                [golds[i] for i in idx],
                task=task,
                all_classes=[classes[i] for i in idx],
            )
    return result
