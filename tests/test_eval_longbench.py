"""LongBench loader, task table, prompts and per-bucket scoring on the fixture files."""

import json
import math
import pathlib
import re

import pytest

from sparsebalance_jax.eval import longbench, metrics

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "longbench"

LONGBENCH_TASKS = {
    "narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh", "hotpotqa", "2wikimqa",
    "musique", "dureader", "gov_report", "qmsum", "multi_news", "vcsum", "trec", "triviaqa",
    "samsum", "lsht", "passage_count", "passage_retrieval_en", "passage_retrieval_zh", "lcc",
    "repobench-p",
}


def test_task_table_is_complete_and_consistent():
    assert set(longbench.TASKS) == LONGBENCH_TASKS
    assert set(longbench.LONGBENCH_E_TASKS) <= LONGBENCH_TASKS
    for spec in longbench.TASKS.values():
        assert spec.metric in metrics.METRICS, spec.name
        assert spec.max_new_tokens > 0
        # Every template formats with the two fields and uses the context.
        text = spec.template.format(context="<CTX>", input="<IN>")
        assert "<CTX>" in text, spec.name
    for task in ("multifieldqa_zh", "dureader", "vcsum", "passage_retrieval_zh"):
        assert longbench.TASKS[task].metric.endswith("_zh")


def test_load_fixture():
    examples = longbench.load_task(FIXTURES, "hotpotqa")
    assert [e.id for e in examples] == ["hq-0", "hq-1", "hq-2"]
    assert examples[1].answers == ("Miriam Osk", "Osk")
    assert examples[0].all_classes is None
    trec = longbench.load_task(FIXTURES, "trec")
    assert "Other location" in trec[0].all_classes
    # Integer answers (passage_count) become strings.
    assert longbench.load_task(FIXTURES, "passage_count")[0].answers == ("2",)
    e_examples = longbench.load_task(FIXTURES, "passage_retrieval_en", longbench_e=True)
    assert e_examples[0].answers == ("Paragraph 2",)
    # LongBench-E rows name their dataset with the "_e" suffix; the example carries the task.
    assert e_examples[0].dataset == "passage_retrieval_en"


def test_longbench_e_rows_may_name_the_task_with_or_without_its_suffix(tmp_path):
    row = json.loads((FIXTURES / "passage_retrieval_en_e.jsonl").read_text())
    for name in ("passage_retrieval_en", "passage_retrieval_en_e"):
        (tmp_path / "passage_retrieval_en_e.jsonl").write_text(
            json.dumps({**row, "dataset": name}) + "\n")
        example, = longbench.load_task(tmp_path, "passage_retrieval_en", longbench_e=True)
        assert example.dataset == "passage_retrieval_en"
    # A plain LongBench file holds the bare name only.
    (tmp_path / "passage_retrieval_en.jsonl").write_text(
        json.dumps({**row, "dataset": "passage_retrieval_en_e"}) + "\n")
    with pytest.raises(ValueError, match=r"jsonl:1: field 'dataset' is 'passage_retrieval_en_e', "
                                         r"expected 'passage_retrieval_en'$"):
        longbench.load_task(tmp_path, "passage_retrieval_en")


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"qasper\.jsonl"):
        longbench.load_task(tmp_path, "qasper")
    with pytest.raises(FileNotFoundError, match=r"hotpotqa_e\.jsonl"):
        longbench.load_task(FIXTURES, "hotpotqa", longbench_e=True)
    with pytest.raises(ValueError, match="unknown LongBench task 'squad'"):
        longbench.load_task(FIXTURES, "squad")


def test_malformed_rows_are_errors(tmp_path):
    row = json.loads((FIXTURES / "lcc.jsonl").read_text().splitlines()[0])
    del row["answers"]
    (tmp_path / "lcc.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"lcc\.jsonl:1: missing field\(s\) \['answers'\]"):
        longbench.load_task(tmp_path, "lcc")
    row["answers"] = ["x"]
    row["dataset"] = "trec"
    (tmp_path / "lcc.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="'dataset' is 'trec'"):
        longbench.load_task(tmp_path, "lcc")


@pytest.mark.parametrize(
    "length, bucket",
    [(0, "0-4k"), (3999, "0-4k"), (4000, "4-8k"), (7999, "4-8k"), (8000, "8k+"), (10**6, "8k+")],
)
def test_length_buckets(length, bucket):
    assert longbench.length_bucket(length) == bucket


def test_prompt_and_truncation():
    (example,) = longbench.load_task(FIXTURES, "multifieldqa_zh")
    prompt = longbench.build_prompt(example)
    assert example.context in prompt
    assert prompt.index(example.context) < prompt.index(example.input)
    assert longbench.truncate_middle(list(range(10)), 4) == [0, 1, 8, 9]
    assert longbench.truncate_middle(list(range(10)), 5) == [0, 1, 8, 9]  # as pred.py
    assert longbench.truncate_middle([1, 2], 5) == [1, 2]


def test_truncate_middle_keeps_at_most_max_len_from_the_two_ends():
    for n in range(13):
        ids = list(range(100, 100 + n))
        for max_len in range(1, 15):
            out = longbench.truncate_middle(ids, max_len)
            assert len(out) <= max_len, (n, max_len)
            half = max_len // 2
            assert out == (ids if n <= max_len else ids[:half] + ids[n - half:]), (n, max_len)


def test_answer_budgets_hold_longbench_answers_in_bytes():
    """A byte-tokenizer budget is LongBench's max_new_tokens at ~4 bytes an English token and
    ~4.5 a Chinese one (1.5 characters of 3 bytes), rounded up; the Chinese tasks are those with
    Chinese prompts."""
    cjk = re.compile("[\u4e00-\u9fff]")
    assert longbench.ZH_TASKS == {t for t, spec in longbench.TASKS.items()
                                  if cjk.search(spec.template)}
    for task, spec in longbench.TASKS.items():
        per_token = 1.5 * 3 if task in longbench.ZH_TASKS else 4
        assert longbench.answer_budget(task, "bytes") == math.ceil(spec.max_new_tokens
                                                                   * per_token), task
    with pytest.raises(ValueError, match="'sentencepiece'"):
        longbench.answer_budget("hotpotqa", "sentencepiece")


def test_score_task_per_bucket():
    examples = longbench.load_task(FIXTURES, "hotpotqa")  # lengths: 0-4k, 4-8k, 8k+
    scores = longbench.score_task("hotpotqa", examples, ["Amber river", "Osk", "1950"])
    assert scores == {"all": 66.67, "0-4k": 100.0, "4-8k": 100.0, "8k+": 0.0}
