"""Tokenizer, length distributions, document records, text source and the jsonl loader."""

import json

import numpy as np
import pytest

from sparsebalance_jax.data import documents, sources
from sparsebalance_jax.data.jsonl import JsonlIndex, MalformedDataError, RecordError, parse_record
from sparsebalance_jax.data.lengths import sample_lengths
from sparsebalance_jax.data.tokenizer import (ASSISTANT_ID, BOS_ID, EOS_ID, USER_ID,
                                              make_tokenizer)

TOK = make_tokenizer("bytes")


def test_byte_tokenizer_round_trip_and_ids():
    text = "Straße — 東京 ok"
    ids = TOK.encode(text)
    assert ids.dtype == np.int32 and ids.max() < 256 and len(ids) == len(text.encode())
    assert TOK.decode(np.concatenate([[BOS_ID], ids, [EOS_ID]])) == text
    s = TOK.special
    assert len({s.pad, s.bos, s.eos, s.user, s.assistant, s.system}) == 6
    assert min(s.pad, s.bos, s.eos, s.user, s.assistant, s.system) >= 256
    assert TOK.vocab_size == 262 and TOK.padded_vocab_size() == 384


def test_unknown_tokenizer_kind_raises():
    with pytest.raises(ValueError, match="'sentencepiece' is not supported"):
        make_tokenizer("sentencepiece")


# The p10 / p50 / p90 / p99 that lengths.py's module docstring gives for each distribution.
DOCUMENTED_QUANTILES = {
    ("longalign", 1.0): (9.9e3, 16.8e3, 32e3, 54e3),
    ("longalign", 1 / 32): (310, 520, 1000, 1700),
    ("chatqa2", 1.0): (0.5e3, 1.7e3, 32e3, 56e3),
}


def test_length_distributions_have_documented_shape():
    rng = np.random.default_rng()
    big = 10**9
    for (kind, scale), quantiles in DOCUMENTED_QUANTILES.items():
        lengths = sample_lengths(kind, rng, 50000, scale, 1, big)
        # The docstring rounds to two digits; 50000 draws landed within 3.8% of it (worst
        # quantile over 20 seeds), where a median moved by 1/15 shifts them by up to 6.7%.
        np.testing.assert_allclose(np.percentile(lengths, [10, 50, 90, 99]), quantiles,
                                   rtol=0.05, err_msg=f"{kind} at scale {scale}")
    la = sample_lengths("longalign", rng, 20000, 1.0, 1, big)
    assert la.min() >= 8192 and la.max() <= 73728
    assert la.mean() > np.median(la)  # long right tail
    cq = sample_lengths("chatqa2", rng, 20000, 1.0, 1, big)
    assert np.all((cq <= 4096) | (cq >= 16384)), "bimodal: nothing between 4K and 16K"
    assert 0.66 < np.mean(cq <= 4096) < 0.74
    cpu = sample_lengths("longalign", rng, 5000, 1 / 32, 1, big)
    assert cpu.min() >= 256 and cpu.max() <= 2304
    clipped = sample_lengths("chatqa2", rng, 5000, 1 / 32, 64, 1024)
    assert clipped.min() == 64 and clipped.max() == 1024
    uni = sample_lengths("uniform", rng, 5000, 1.0, 10, 20)
    assert set(np.unique(uni)) == set(range(10, 21))
    assert np.all(sample_lengths("fixed", rng, 7, 1.0, 1, 99) == 99)
    with pytest.raises(ValueError, match="'pareto' unknown"):
        sample_lengths("pareto", rng, 3)


def test_lengths_deterministic_given_seed():
    a = sample_lengths("chatqa2", np.random.default_rng(5), 100)
    b = sample_lengths("chatqa2", np.random.default_rng(5), 100)
    c = sample_lengths("chatqa2", np.random.default_rng(6), 100)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_chat_tokens_train_on_assistant_turns_only():
    turns = [("system", "S"), ("user", "hello"), ("assistant", "hi!"), ("user", "q"),
             ("assistant", "ans")]
    doc = documents.make_document(*documents.chat_tokens(turns, TOK))
    assert documents.validate_document(doc) == len(doc["inputs"])
    assert np.array_equal(doc["targets"][:-1], doc["inputs"][1:])
    trained = doc["targets"][doc["loss_mask"] > 0]
    # Assistant contents, each followed by the id that closes the turn (next USER or EOS).
    expected = np.concatenate([TOK.encode("hi!"), [USER_ID], TOK.encode("ans"), [EOS_ID]])
    assert np.array_equal(trained, expected)
    assert doc["inputs"][0] == BOS_ID and ASSISTANT_ID in doc["inputs"]


def test_crop_keeps_tail_and_counts():
    doc = documents.make_document(np.arange(101), np.ones(101, bool))
    counter = documents.CropCounter()
    assert documents.crop_document(doc, 200, counter) is doc and counter.count == 0
    cropped = documents.crop_document(doc, 40, counter)
    assert np.array_equal(cropped["targets"], np.arange(61, 101))
    assert counter.count == 1 and counter.tokens_removed == 60


def test_text_documents_have_the_drawn_length_and_real_text():
    corpus = sources.load_corpus()
    assert corpus.num_articles > 9000
    rng = np.random.default_rng()
    for n in rng.integers(2, 3000, size=5):
        doc = sources.text_document(corpus, TOK, rng, int(n))
        assert documents.validate_document(doc) == n
        assert doc["inputs"][0] == BOS_ID and doc["targets"][-1] == EOS_ID
        assert np.all(doc["loss_mask"] == 1)
    words = TOK.decode(sources.text_document(corpus, TOK, rng, 2000)["inputs"]).split()
    assert sum(w.lower() in ("the", "of", "and") for w in words) > 20  # English prose


def _write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


GOOD = [
    json.dumps({"messages": [{"role": "user", "content": "long doc. Q?"},
                             {"role": "assistant", "content": "A1"}]}),
    json.dumps({"messages": [{"role": "user", "content": "Q?"}], "document": "DOC",
                "answers": ["A2", "alt"]}),
    json.dumps({"question": "User: Q?\n\nAssistant:", "answer": ["A3"],
                "sub-paragraphs": "CTX"}),
    json.dumps({"input": "Q?", "output": "A4", "context": "C"}),
]


def test_jsonl_layouts_parse_with_loss_on_answers(tmp_path):
    path = _write_jsonl(tmp_path / "good.jsonl", GOOD + [""])  # A blank line is no record.
    index = JsonlIndex([path])
    assert len(index) == 4 and index.bad_lines == []
    assert index[1] == [("user", "DOC\n\nQ?"), ("assistant", "A2")]
    assert index[2] == [("user", "CTX\n\nUser: Q?\n\nAssistant:"), ("assistant", "A3")]
    for i, answer in enumerate(["A1", "A2", "A3", "A4"]):
        doc = documents.make_document(*documents.chat_tokens(index[i], TOK))
        assert TOK.decode(doc["targets"][doc["loss_mask"] > 0]) == answer


def test_malformed_jsonl_lines_reported_with_line_numbers_and_limit(tmp_path, caplog):
    lines = [GOOD[0], "{not json", GOOD[1],
             json.dumps({"messages": [{"role": "user", "content": "no answer"}]}),
             json.dumps({"messages": [{"role": "robot", "content": "x"}]}), GOOD[3]]
    path = _write_jsonl(tmp_path / "mixed.jsonl", lines)
    index = JsonlIndex([path], max_bad_lines=3)
    assert len(index) == 3
    assert [(p, n) for p, n, _ in index.bad_lines] == [(path, 2), (path, 4), (path, 5)]
    assert "invalid JSON" in index.bad_lines[0][2]
    assert "no non-empty assistant turn" in index.bad_lines[1][2]
    assert f"{path}:4: malformed record skipped" in caplog.text
    with pytest.raises(MalformedDataError, match=rf"{path}:5: .*3 malformed lines, more than "
                                                 r"max_bad_lines=2"):
        JsonlIndex([path], max_bad_lines=2)


def test_jsonl_text_utf8_cannot_encode_is_a_malformed_line(tmp_path):
    # A lone surrogate (half an emoji, escaped as \ud83d) is valid JSON but not encodable text:
    # the scan names its line instead of the tokenizer failing later in a loader thread.
    cut = json.dumps({"messages": [{"role": "user", "content": "cut emoji \ud83d"},
                                   {"role": "assistant", "content": "ok"}]})
    assert "\\ud83d" in cut
    path = _write_jsonl(tmp_path / "cut.jsonl", [GOOD[0], cut])
    with pytest.raises(MalformedDataError, match=rf"{path}:2: field 'messages\[0\]\.content' is "
                                                 r"not valid Unicode text"):
        JsonlIndex([path])
    index = JsonlIndex([path], max_bad_lines=1)
    assert len(index) == 1 and [n for _, n, _ in index.bad_lines] == [2]


def test_every_jsonl_file_must_give_records(tmp_path):
    good = _write_jsonl(tmp_path / "good.jsonl", GOOD)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    blank_answer = _write_jsonl(tmp_path / "blank_answer.jsonl", [json.dumps(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]})])
    with pytest.raises(MalformedDataError, match=rf"{empty}: no usable records"):
        JsonlIndex([good, str(empty)])
    with pytest.raises(MalformedDataError, match=rf"{blank_answer}: no usable records"):
        JsonlIndex([good, blank_answer], max_bad_lines=1)


def test_parse_record_rejects_unknown_layout():
    with pytest.raises(ValueError, match="unrecognised layout"):
        parse_record({"text": "x"})


@pytest.mark.parametrize("record, field", [
    ({"question": None, "answer": "a"}, "question"),
    ({"question": "q", "answer": None}, "answer"),
    ({"question": "q", "answer": [None]}, "answer"),
    ({"input": None, "output": "a"}, "input"),
    ({"input": "q", "output": None}, "output"),
])
def test_parse_record_refuses_a_null_prompt_or_answer(record, field):
    # Null is an empty turn only in a message's content (LongAlign's few nulls) or an optional
    # context; a null question or answer is a broken record, not an answer-only document.
    with pytest.raises(RecordError, match=f"field '{field}' is null"):
        parse_record(record)


def test_parse_record_null_content_and_context_are_empty():
    assert parse_record({"messages": [{"role": "system", "content": None},
                                      {"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "a"}]}) == [
        ("system", ""), ("user", "q"), ("assistant", "a")]
    assert parse_record({"input": "q", "output": "a", "context": None}) == [
        ("user", "q"), ("assistant", "a")]


def test_decode_drops_every_special_id_and_a_cut_last_character():
    """Special ids (PAD included) are no text wherever they sit, and a multi-byte character cut
    short at the end (a generation stopped by its budget) is dropped, not turned into U+FFFD."""
    rng = np.random.default_rng()
    alphabet = list("abc xyz.") + ["ß", "é", "東", "京", "😀"]
    text = "".join(rng.choice(alphabet, size=40))
    ids = TOK.encode(text)
    s = TOK.special
    specials = [s.pad, s.bos, s.eos, s.user, s.assistant, s.system]
    at = np.sort(rng.integers(0, len(ids) + 1, size=12))
    mixed = np.insert(ids, at, rng.choice(specials, size=12))
    assert TOK.decode(mixed) == text
    for char in ("é", "東", "😀"):
        cut = TOK.encode("ok" + char)[:-1]
        assert TOK.decode(cut) == "ok"
        assert TOK.decode(np.concatenate([cut, [s.pad, s.eos]])) == "ok"


def test_jsonl_records_read_back_after_skipped_and_blank_lines(tmp_path):
    """Records are re-read by byte offset: every record after a malformed or blank line (in any
    of several files) reads back as the line it was scanned from."""
    rng = np.random.default_rng()
    paths, want = [], []
    for f in range(2):
        lines = []
        for i in range(int(rng.integers(4, 8))):
            kind = rng.integers(3)
            if kind == 0:
                lines.append(rng.choice(["", "   ", "{broken", json.dumps({"text": "x"})]))
            good = json.dumps({"input": f"q {f}.{i} " + "é" * int(rng.integers(0, 5)),
                               "output": f"a {f}.{i}"})
            lines.append(good)
            want.append(parse_record(json.loads(good)))
        paths.append(_write_jsonl(tmp_path / f"f{f}.jsonl", lines))
    index = JsonlIndex(paths, max_bad_lines=100)
    assert [index[i] for i in range(len(index))] == want
    assert index[len(index) - 1] == want[-1] and index[0] == want[0]


def test_chatqa_answers_document_and_blank_context():
    """`answers` gives the final assistant turn only when `messages` ends with the user; the
    `document` goes before the first user turn; a context of whitespace adds nothing."""
    msgs = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"}]
    assert parse_record({"messages": msgs, "document": "DOC", "answers": "a2"}) == [
        ("user", "DOC\n\nq1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]
    assert parse_record({"messages": msgs[:2], "answers": ["other"]}) == [
        ("user", "q1"), ("assistant", "a1")]
    assert parse_record({"input": "q", "output": "a", "context": " \n\t"}) == [
        ("user", "q"), ("assistant", "a")]
    assert parse_record({"question": "q", "answer": "a", "sub-paragraphs": "  "}) == [
        ("user", "q"), ("assistant", "a")]
    assert parse_record({"messages": msgs, "document": "\n", "answers": ["a2"]})[0] == (
        "user", "q1")


@pytest.mark.parametrize("record, field", [
    ({"question": "q", "answer": 42}, "answer"),
    ({"question": ["q"], "answer": "a"}, "question"),
    ({"input": "q", "output": 1.5}, "output"),
    ({"input": "q", "output": "a", "context": {"text": "c"}}, "context"),
    ({"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "a"}]},
     r"messages\[0\]\.content"),
])
def test_parse_record_refuses_a_field_that_is_not_text(record, field):
    with pytest.raises(RecordError, match=f"field '{field}' must be a string"):
        parse_record(record)
