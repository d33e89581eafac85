"""LongBench metrics on answers whose scores were worked out by hand."""

import pytest

from sparsebalance_jax.eval import metrics


def test_normalisation():
    assert metrics.normalize_en("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert metrics.normalize_en("An apple a day") == "apple day"
    assert metrics.normalize_zh("北京， 中国。Ab") == "北京中国ab"


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        # "eiffel tower in paris" vs "eiffel tower": P = 2/4, R = 1 -> 2/3.
        ("The Eiffel Tower, in Paris.", "Eiffel Tower", 2 / 3),
        ("An apple", "the apple", 1.0),
        ("London", "Paris", 0.0),
        # Repeated tokens are matched by count: pred [a1 a1 b], gold [a1 b b] -> 2 common.
        ("x x y", "x y y", 2 / 3),
        ("", "Paris", 0.0),
    ],
)
def test_qa_f1(pred, gold, expected):
    assert metrics.qa_f1(pred, gold) == pytest.approx(expected)


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("北京市", "北京", 0.8),  # P = 2/3, R = 1
        ("北京，中国。", "北京", 2 / 3),  # punctuation dropped: 4 chars, P = 1/2, R = 1
        ("上海", "北京", 0.0),
    ],
)
def test_qa_f1_zh(pred, gold, expected):
    assert metrics.qa_f1_zh(pred, gold) == pytest.approx(expected)


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("the cat sat on the mat", "the cat lay on the mat", 5 / 6),  # LCS 5 of 6 and 6
        # LCS "the gunman" = 2: P = 2/4, R = 2/6, F = 2PR/(P+R) = 0.4.
        ("police killed the gunman", "the gunman was shot by police", 0.4),
        ("Alpha, beta.", "alpha beta", 1.0),
        ("", "alpha", 0.0),
    ],
)
def test_rouge_l(pred, gold, expected):
    assert metrics.rouge_l(pred, gold) == pytest.approx(expected)


def test_rouge_l_zh():
    # LCS "我喜欢" = 3: P = 3/4, R = 3/5 -> 2/3.
    assert metrics.rouge_l_zh("我喜欢猫", "我也喜欢狗") == pytest.approx(2 / 3)
    assert metrics.rouge_l_zh("今天，天气好。", "今天天气好") == pytest.approx(1.0)


def test_classification():
    classes = ["Location", "Person", "Number"]
    assert metrics.classification("Location", "Location", classes) == 1.0
    assert metrics.classification("Location or Person", "Location", classes) == 0.5
    assert metrics.classification("Number", "Location", classes) == 0.0
    # "city" is a substring of the gold "capital city": writing the gold out must not
    # count as also naming "city".
    nested = ["city", "capital city"]
    assert metrics.classification("capital city", "capital city", nested) == 1.0
    assert metrics.classification("capital city", "city", nested) == 0.5
    assert metrics.classification("体育新闻", "体育", ["体育", "财经"]) == 1.0
    with pytest.raises(ValueError, match="all_classes"):
        metrics.classification("x", "x", [])


def test_retrieval():
    assert metrics.retrieval("Paragraph 12", "Paragraph 12") == 1.0
    assert metrics.retrieval("Paragraph 3 or Paragraph 12", "Paragraph 12") == 0.5
    assert metrics.retrieval("Paragraph 1", "Paragraph 12") == 0.0  # whole numbers only
    assert metrics.retrieval("I do not know", "Paragraph 12") == 0.0
    assert metrics.retrieval_zh("答案是段落5", "段落5") == 1.0
    assert metrics.retrieval_zh("段落5和段落7", "段落5") == 0.5
    with pytest.raises(ValueError, match="Paragraph"):
        metrics.retrieval("Paragraph 1", "the first one")


def test_count():
    assert metrics.count("7", "7") == 1.0
    assert metrics.count("There are 7 unique paragraphs out of 10", "7") == 0.5
    assert metrics.count("seven", "7") == 0.0
    assert metrics.count("17", "7") == 0.0


def test_code_sim():
    assert metrics.edit_similarity("abcd", "abce") == pytest.approx(0.75)  # 2 * 3 / 8
    fenced = "```python\n    return x + 1\n```"
    assert metrics.code_sim(fenced, "    return x + 1") == 1.0
    # The comment line is skipped; "foo(bar)" vs "foo(baz)": LCS 7 -> 14 / 16.
    assert metrics.code_sim("# call it\nfoo(bar)", "foo(baz)") == pytest.approx(0.875)
    assert metrics.code_sim("// only comments", "foo()") == 0.0


def test_first_line_tasks_and_max_over_golds():
    classes = [["Location", "Person"]]
    # trec keeps the first line only: without the cut both classes would match (0.5).
    assert metrics.score_predictions(
        "classification", ["Location\nPerson"], [["Location"]], task="trec", all_classes=classes
    ) == 100.0
    assert metrics.score_predictions(
        "classification", ["Location\nPerson"], [["Location"]], task="other",
        all_classes=classes,
    ) == 50.0
    # Best over gold answers: "Paris France" scores 2/3 against "Paris", 1 against the other.
    assert metrics.score_example(
        "qa_f1", "Paris France", ["Paris", "Paris, France"], task="hotpotqa"
    ) == pytest.approx(1.0)


def test_score_is_100_times_mean_rounded():
    preds = ["Eiffel Tower", "The Eiffel Tower, in Paris.", "London"]
    golds = [["Eiffel Tower"], ["Eiffel Tower"], ["Paris"]]
    # (1 + 2/3 + 0) / 3 = 0.5555... -> 55.56
    assert metrics.score_predictions("qa_f1", preds, golds, task="hotpotqa") == 55.56


def test_scoring_errors():
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        metrics.score_example("bleu", "a", ["a"], task="x")
    with pytest.raises(ValueError, match="2 predictions for 1 examples"):
        metrics.score_predictions("qa_f1", ["a", "b"], [["a"]], task="x")
    with pytest.raises(ValueError, match="no gold answers"):
        metrics.score_example("qa_f1", "a", [], task="x")
