"""LongBench metrics against the values of LongBench's own scorer.

Every expected value below was obtained by running the official LongBench scorer on the same
inputs: the per-pair scores and normalised strings from THUDM/LongBench `metrics.py` at commit
f6227eb (rouge 1.0.1, jieba 0.42.1, fuzzywuzzy 0.18.0 with python-Levenshtein 0.27.5), the task
scores from that repository's `eval.py` `scorer` at commit f77be4c (which adds the first-line
rule). They are compared for exact equality: the same libraries do the same arithmetic (the code
ratio through rapidfuzz, on which python-Levenshtein is built).
"""

import pytest

from sparsebalance_jax.eval import metrics

LOCATION = ("Location", "Person", "Number")

# (metric, prediction, gold, all_classes, official score)
OFFICIAL = [
    ("qa_f1", "The Eiffel Tower, in Paris.", "Eiffel Tower", None, 0.6666666666666666),
    ("qa_f1", "An apple", "the apple", None, 1.0),
    ("qa_f1", "x x y", "x y y", None, 0.6666666666666666),
    ("qa_f1", "London", "Paris", None, 0.0),
    ("qa_f1", "", "Paris", None, 0.0),
    ("qa_f1", "\u201cHamlet\u201d", "Hamlet", None, 0.0),  # curly quotes are not removed
    ("qa_f1", "Saint\u2013Petersburg", "Saint Petersburg", None, 0.0),
    ("qa_f1", "It's $1,000!", "1000 dollars", None, 0.5),
    ("qa_f1_zh", "北京市", "北京", None, 0.0),  # jieba words: 北京市 is one word
    ("qa_f1_zh", "中华人民共和国成立于1949年", "1949年", None, 0.5714285714285715),
    ("qa_f1_zh", "北京，中国。", "北京", None, 0.6666666666666666),
    ("qa_f1_zh", "我喜欢 Python！", "我喜欢python", None, 1.0),
    ("qa_f1_zh", "上海", "北京", None, 0.0),
    ("rouge_l", "The cat sat on the mat. The dog barked.",
     "the cat lay on the mat. a dog barked loudly.", None, 0.7058823479584776),
    ("rouge_l", "the the the the cat", "the cat", None, 0.999999995),  # distinct words
    ("rouge_l", "Police killed the gunman", "the gunman was shot by police", None,
     0.39999999520000007),
    ("rouge_l", "Alpha, beta.", "alpha beta", None, 0.4999999950000001),  # case, comma kept
    ("rouge_l", "", "alpha", None, 0.0),
    ("rouge_l", "...", "alpha", None, 0.0),
    ("rouge_l_zh", "我喜欢猫", "我也喜欢狗", None, 0.5714285665306124),
    ("rouge_l_zh", "今天，天气好。", "今天天气好", None, 0.2857142816326531),
    ("rouge_l_zh", "会议讨论了预算和人员安排。", "会议主要讨论了预算。", None, 0.7142857093877552),
    ("classification", "Location", "Location", LOCATION, 1.0),
    ("classification", "Location or Person", "Location", LOCATION, 0.5),
    ("classification", "Number", "Location", LOCATION, 0.0),
    ("classification", "capital city", "capital city", ("city", "capital city"), 1.0),
    ("classification", "capital city", "city", ("city", "capital city"), 0.5),
    ("classification", "ab", "ab", ("a", "b", "ab"), 0.5),  # LongBench's loop skips "b"
    ("classification", "体育新闻", "体育", ("体育", "财经"), 1.0),
    ("retrieval", "Paragraph 12", "Paragraph 12", None, 1.0),
    ("retrieval", "Paragraph 3 or Paragraph 12", "Paragraph 12", None, 0.5),
    ("retrieval", "Paragraph 1", "Paragraph 12", None, 0.0),
    ("retrieval", "I do not know", "Paragraph 12", None, 0.0),
    ("retrieval_zh", "答案是段落5", "段落5", None, 1.0),
    ("retrieval_zh", "段落5和段落7", "段落5", None, 0.5),
    ("count", "7", "7", None, 1.0),
    ("count", "There are 7 unique paragraphs out of 10", "7", None, 0.5),
    ("count", "seven", "7", None, 0.0),
    ("count", "17", "7", None, 0.0),
    ("count", "7", " 7", None, 0.0),  # the gold is compared as written
    ("code_sim", "foo(bar, baz)", "foo(bar, qux)", None, 0.77),
    ("code_sim", "```python\n    return x + 1\n```", "    return x + 1", None, 1.0),
    ("code_sim", "# call it\nfoo(bar)", "foo(baz)", None, 0.88),
    ("code_sim", "// only comments", "foo()", None, 0.0),
    ("code_sim", "", "", None, 1.0),
    ("code_sim", "a, b = b, a", "b, a = a, b", None, 0.64),  # difflib's ratio would give 0.36
]


@pytest.mark.parametrize("metric, pred, gold, classes, expected", OFFICIAL,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(OFFICIAL)])
def test_metrics_equal_the_official_scorer(metric, pred, gold, classes, expected):
    fn = metrics.METRICS[metric]
    score = fn(pred, gold, classes) if metric == "classification" else fn(pred, gold)
    assert score == expected


def test_rouge_l_is_zero_where_the_rouge_package_raises():
    # The package's LCS recurses a call deeper per word: two identical 1000-word sentences
    # pass Python's default recursion limit (1000), and LongBench scores them 0.
    run_on = " ".join(f"w{i}" for i in range(1000))
    assert metrics.rouge_l(run_on, run_on) == 0.0


def test_task_scores_equal_the_official_scorer():
    # trec keeps the first line only: without the cut both classes would match (50).
    assert metrics.score_predictions(
        "classification", ["Location\nPerson"], [["Location"]], task="trec",
        all_classes=[("Location", "Person")]) == 100.0
    assert metrics.score_predictions(
        "rouge_l", ["\nAnna will bring the cake.\nDialogue: ..."], [["Anna brings the cake."]],
        task="samsum") == 66.67
    # Best over gold answers.
    assert metrics.score_predictions(
        "qa_f1", ["Paris France"], [["Paris", "Paris, France"]], task="hotpotqa") == 100.0
    assert metrics.score_predictions(
        "qa_f1", ["Eiffel Tower", "The Eiffel Tower, in Paris.", "London"],
        [["Eiffel Tower"], ["Eiffel Tower"], ["Paris"]], task="hotpotqa") == 55.56


def test_normalisation():
    assert metrics.normalize_en("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert metrics.normalize_en("\u201cAn apple\u201d a day") == "\u201c apple\u201d day"
    assert metrics.normalize_zh("北京， 中国。Ab") == "北京中国ab"


def test_scoring_errors():
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        metrics.score_example("bleu", "a", ["a"], task="x")
    with pytest.raises(ValueError, match="2 predictions for 1 examples"):
        metrics.score_predictions("qa_f1", ["a", "b"], [["a"]], task="x")
    with pytest.raises(ValueError, match="no gold answers"):
        metrics.score_example("qa_f1", "a", [], task="x")
    with pytest.raises(ValueError, match="all_classes"):
        metrics.classification("x", "x", [])
    with pytest.raises(ValueError, match="Paragraph"):
        metrics.retrieval("Paragraph 1", "the first one")
