"""Synthetic suite: seeding, cell independence, and exact-match scoring."""

import pytest

from sparsebalance_jax.data import synthetic
from sparsebalance_jax.eval import suite

_HAYSTACK = [
    "The river runs north past the old mill. Fields of barley line both banks.",
    "A small town grew around the bridge. Its market opens on Saturdays.",
    "Winters are cold and long here. Summers bring storms from the west.",
]


def test_suite_grid_and_determinism():
    items = suite.build_suite(_HAYSTACK, seed=5, lengths=(800, 1600), per_cell=2)
    assert len(items) == len(synthetic.TASKS) * 2 * 2
    assert [(i.task, i.target_chars, i.index) for i in items[:4]] == [
        ("needle", 800, 0), ("needle", 800, 1), ("needle", 1600, 0), ("needle", 1600, 1)]
    again = suite.build_suite(_HAYSTACK, seed=5, lengths=(800, 1600), per_cell=2)
    assert items == again
    other_seed = suite.build_suite(_HAYSTACK, seed=6, lengths=(800, 1600), per_cell=2)
    assert [i.example for i in items] != [i.example for i in other_seed]


def test_items_do_not_depend_on_the_rest_of_the_grid():
    big = suite.build_suite(_HAYSTACK, seed=1, lengths=(700, 1200), per_cell=3)
    small = suite.build_suite(_HAYSTACK, seed=1, lengths=(1200,), per_cell=1,
                              tasks=("vartrack",))
    (match,) = [i for i in big if (i.task, i.target_chars, i.index) == ("vartrack", 1200, 0)]
    assert small == [match]


def test_exact_match_scoring():
    items = suite.build_suite(_HAYSTACK, seed=0, lengths=(900,), per_cell=1)
    answers = [i.example.answer for i in items]
    assert all(suite.score_predictions(items, answers))
    # Case, punctuation, spacing and a continuation after the first line are ignored.
    noisy = [" " + a.upper().replace(", ", " ,  ") + ".\nQuestion: more" for a in answers]
    assert all(suite.score_predictions(items, noisy))
    wrong = [a[:-1] for a in answers]  # last character dropped
    assert not any(suite.score_predictions(items, wrong))
    assert not suite.exact_match("1234567 7654321", "1234567")
    with pytest.raises(ValueError, match="2 predictions for 5 suite items"):
        suite.score_predictions(items, ["a", "b"])


def test_normalize_answer():
    assert suite.normalize_answer("  ABCDE, FGHIJ.") == "abcde fghij"
    assert suite.normalize_answer("apple,jungle ,tiger") == "apple jungle tiger"
    # Letters outside ASCII are words too: extra ones make another answer.
    assert suite.normalize_answer("ABCDEß, FGHIJ") == "abcdess fghij"
    assert not suite.exact_match("1234567é", "1234567")
    assert not suite.exact_match("1234567 日本", "1234567")
    assert suite.exact_match("Ünïcode_ÀB", "ünïcode àb")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown synthetic task 'qa'"):
        suite.build_suite(_HAYSTACK, seed=0, lengths=(900,), per_cell=1, tasks=("qa",))
    with pytest.raises(ValueError, match="per_cell"):
        suite.build_suite(_HAYSTACK, seed=0, lengths=(900,), per_cell=0)
