"""Eval harness: answer alignment with an oracle model, per-row greedy budgets, padding
invariance with a real tiny model, checks that fail before any model work, checkpoint
restore, summary rows and JSON."""

import dataclasses
import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs.longbench import get_config
from sparsebalance_jax.config import ConfigError, from_config_dict
from sparsebalance_jax.data import sources, synthetic
from sparsebalance_jax.data.tokenizer import ByteTokenizer
from sparsebalance_jax.eval import harness, longbench, suite
from sparsebalance_jax.model import Transformer

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "longbench"
TOK = ByteTokenizer()
VOCAB = 384
HAYSTACK = [
    "The river runs north past the old mill. Fields of barley line both banks.",
    "A small town grew around the bridge. Its market opens on Saturdays.",
    "Winters are cold and long here. Summers bring storms from the west.",
]


def _settings(mode, batch_size=5, seq_multiple=64, max_seq_len=2048, min_seq_len=64):
    return harness.EvalSettings(mode=mode, batch_size=batch_size, seq_multiple=seq_multiple,
                                min_seq_len=min_seq_len, budget=2, max_seq_len=max_seq_len)


def _host_apply_fn(host):
    """An apply_fn whose logits come from host(inputs_BT, segment_ids_BT) [B, T, VOCAB]."""

    def apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B):
        del params, positions_BT, budget_B
        shape = jax.ShapeDtypeStruct((*inputs_BT.shape, VOCAB), jnp.float32)
        return jax.pure_callback(host, shape, inputs_BT, segment_ids_BT)

    return apply_fn


def _oracle(prompts_and_answers):
    """apply_fn that knows, for each prompt, the answer to give: logits one-hot (scale 30)
    on the next token of BOS USER prompt ASSISTANT answer EOS, and on EOS past its end.
    Rows are recognised by their tokens up to the ASSISTANT id, so the oracle checks the
    harness's layout as well as its scoring."""
    s = TOK.special
    table = {}
    for prompt, answer in prompts_and_answers:
        ctx = (s.bos, s.user, *TOK.encode(prompt).tolist(), s.assistant)
        table[ctx] = np.array([*ctx, *TOK.encode(answer).tolist(), s.eos], np.int32)

    def host(inputs_BT, segment_ids_BT):
        batch, length = inputs_BT.shape
        logits = np.zeros((batch, length, VOCAB), np.float32)
        for b in range(batch):
            n = int(segment_ids_BT[b].sum())
            if n == 0:
                continue
            row = inputs_BT[b, :n].tolist()
            full = table[tuple(row[: row.index(s.assistant) + 1])]
            nxt = np.full(length, s.eos, np.int32)
            k = min(length, len(full) - 1)
            nxt[:k] = full[1 : k + 1]
            logits[b, np.arange(length), nxt] = 30.0
        return logits

    return _host_apply_fn(host)


def _off_by_one(answer: str) -> str:
    return answer[:-1] + ("0" if answer[-1] != "0" else "1")


@pytest.fixture(scope="module")
def items():
    return suite.build_suite(HAYSTACK, seed=3, lengths=(700,), per_cell=1)


@pytest.mark.parametrize("mode", harness.MODES)
def test_oracle_scores_perfect_and_wrong(items, mode):
    right = _oracle([(it.example.prompt, it.example.answer) for it in items])
    wrong = _oracle([(it.example.prompt, _off_by_one(it.example.answer)) for it in items])
    good = harness.evaluate_suite(harness.Scorer(right, {}, TOK, _settings(mode)), items)
    bad = harness.evaluate_suite(harness.Scorer(wrong, {}, TOK, _settings(mode)), items)
    assert [r.score for r in good] == [1.0] * len(items)
    assert [r.score for r in bad] == [0.0] * len(items)
    if mode == "teacher_forced":
        assert max(r.nll for r in good) < 1e-6
        assert min(r.nll for r in bad) > 0.5  # one token of the answer costs ~30 nats
    else:
        assert [r.prediction for r in good] == [it.example.answer for it in items]
    # Every answer token counts, the first included, and so does the EOS after it: an answer
    # whose first character is wrong, or one that runs on past its end, scores 0.
    for wrong_answer in (lambda a: _off_by_one(a[::-1])[::-1], lambda a: a + "7"):
        other = _oracle([(it.example.prompt, wrong_answer(it.example.answer)) for it in items])
        scored = harness.evaluate_suite(harness.Scorer(other, {}, TOK, _settings(mode)), items)
        assert [r.score for r in scored] == [0.0] * len(items)


def test_greedy_stops_at_eos():
    """Greedy decoding returns the tokens before the first EOS, nothing after it: a model that
    says more after its EOS is not heard."""
    rng = np.random.default_rng()
    pairs = [("".join(rng.choice(list("abcdef"), 50)), "".join(rng.choice(list("0123"), n)))
             for n in (3, 6)]
    oracle = _oracle(pairs)

    def apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B):
        # The oracle past the answer's EOS says "x" instead of EOS again.
        logits = oracle(params, inputs_BT, segment_ids_BT, positions_BT, budget_B)
        eos_BT = jnp.argmax(logits, -1) == TOK.special.eos
        after_BT = jnp.cumsum(eos_BT, axis=1) > 1
        x = TOK.encode("x")[0]
        return jnp.where(after_BT[..., None], 30.0 * jax.nn.one_hot(x, VOCAB), logits)

    scorer = harness.Scorer(apply_fn, {}, TOK, _settings("greedy"))
    out = scorer.greedy([TOK.encode(p) for p, _ in pairs], [12, 12])
    assert [o.tolist() for o in out] == [TOK.encode(a).tolist() for _, a in pairs]


@pytest.mark.parametrize("stop", ["user", "assistant", "system", "pad", "bos"])
def test_greedy_stops_at_any_special_token(stop):
    """A model trained on multi-turn chats closes its turn with the next role token, not EOS:
    greedy decoding stops there too (it had run on into an invented turn, glued to the answer
    once decode dropped the role id), and at PAD or BOS, never an answer's."""
    rng = np.random.default_rng()
    pairs = [("".join(rng.choice(list("abcdef"), 50)), "".join(rng.choice(list("0123"), n)))
             for n in (3, 6)]
    oracle = _oracle(pairs)
    stop_id = getattr(TOK.special, stop)

    def apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B):
        # Where the oracle says EOS first, this model says `stop`, then "x" ever after.
        logits = oracle(params, inputs_BT, segment_ids_BT, positions_BT, budget_B)
        seen_BT = jnp.cumsum(jnp.argmax(logits, -1) == TOK.special.eos, axis=1)
        first_BT = (seen_BT == 1) & (jnp.argmax(logits, -1) == TOK.special.eos)
        x = TOK.encode("x")[0]
        logits = jnp.where(seen_BT[..., None] > 1, 30.0 * jax.nn.one_hot(x, VOCAB), logits)
        return jnp.where(first_BT[..., None], 30.0 * jax.nn.one_hot(stop_id, VOCAB), logits)

    scorer = harness.Scorer(apply_fn, {}, TOK, _settings("greedy"))
    out = scorer.greedy([TOK.encode(p) for p, _ in pairs], [12, 12])
    assert [o.tolist() for o in out] == [TOK.encode(a).tolist() for _, a in pairs]


def test_longbench_greedy_with_oracle():
    examples = longbench.load_task(FIXTURES, "trec") + longbench.load_task(FIXTURES, "hotpotqa")
    pairs = [(longbench.build_prompt(e), e.answers[-1]) for e in examples]
    scorer = harness.Scorer(_oracle(pairs), {}, TOK, _settings("greedy"))
    results = harness.evaluate_longbench(scorer, "trec", examples[:1])
    results += harness.evaluate_longbench(scorer, "hotpotqa", examples[1:])
    assert [r.score for r in results] == [1.0] * 4
    assert [r.bucket for r in results] == ["0-4k", "0-4k", "4-8k", "8k+"]


def test_longbench_answers_longer_than_its_token_budget_in_bytes_score_whole(tmp_path):
    """LongBench's budgets count its models' tokens, ~4 bytes each: a 100-byte English answer
    to a 32-token task and a 60-character (180-byte) Chinese one to a 64-token task are
    generated whole, in both modes, and score perfect; a generation cut inside a character
    drops it, not a replacement mark."""
    answers = {"hotpotqa": "The treaty was signed in the spring by both delegations at the old "
                           "harbour town's council hall",
               "multifieldqa_zh": "该项目由当地政府和三家公司共同出资建设，" * 3}
    examples = []
    for task, answer in answers.items():
        assert len(TOK.encode(answer)) > longbench.TASKS[task].max_new_tokens
        row = {"input": "Who signed it?", "context": "Some context. " * 20, "answers": [answer],
               "length": 500, "dataset": task, "language": "en", "all_classes": None,
               "_id": task}
        (tmp_path / f"{task}.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n")
        examples += longbench.load_task(tmp_path, task)
    pairs = [(longbench.build_prompt(e), e.answers[0]) for e in examples]
    for mode in harness.MODES:
        scorer = harness.Scorer(_oracle(pairs), {}, TOK, _settings(mode))
        results = [r for e in examples for r in harness.evaluate_longbench(scorer, e.dataset, [e])]
        assert [r.score for r in results] == [1.0, 1.0], mode
    assert TOK.decode(TOK.encode(answers["multifieldqa_zh"])[:-1]) == \
        answers["multifieldqa_zh"][:-1]


def _zeros_apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B):
    """A model whose argmax is always byte 0: greedy decoding never meets EOS."""
    return jnp.zeros((*inputs_BT.shape, VOCAB), jnp.float32)


def test_greedy_rows_stop_at_their_own_budget():
    # A prompt that fills the context but for its own short answer's budget, batched with a
    # short prompt whose answer is long: each row gets its own budget, none the batch's largest.
    rng = np.random.default_rng()

    def item(prompt_chars, answer_chars):
        prompt, answer = ("".join(rng.choice(list("abcdefgh"), n)) for n in (prompt_chars,
                                                                             answer_chars))
        return suite.SuiteItem("needle", prompt_chars, 0,
                               synthetic.SyntheticExample(prompt, answer, "needle"))

    full = 1024 - 3 - 5 - harness.SUITE_SLACK  # BOS, USER, ASSISTANT; answer; slack
    items = [item(full, 5), item(100, 40)]
    scorer = harness.Scorer(_zeros_apply_fn, {}, TOK, _settings("greedy", max_seq_len=1024))
    results = harness.evaluate_suite(scorer, items)
    # No EOS is ever predicted, so a prediction's length is its row's budget.
    assert [len(r.prediction) for r in results] == [5 + harness.SUITE_SLACK,
                                                    40 + harness.SUITE_SLACK]
    too_long = [item(full + 1, 5)]
    with pytest.raises(ValueError, match="prompt 0: 1012 tokens .* exceeds max_seq_len=1024"):
        harness.evaluate_suite(scorer, too_long)


def test_too_long_is_an_error(items):
    right = _oracle([(it.example.prompt, it.example.answer) for it in items])
    scorer = harness.Scorer(right, {}, TOK, _settings("teacher_forced", max_seq_len=512))
    with pytest.raises(ValueError, match="exceeds max_seq_len=512"):
        harness.evaluate_suite(scorer, items)


def _tiny_config():
    raw = get_config("cpu")
    raw.attention.implementation = "reference"
    raw.balance.dst = False
    raw.mesh.data = 1
    raw.model.update(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16,
                     mlp_dim=128, compute_dtype="float32")
    return from_config_dict(raw)


def test_padding_and_batching_do_not_change_scores():
    cfg = _tiny_config()
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    dummy = (jnp.zeros((1, 64), jnp.int32), jnp.ones((1, 64), jnp.int32),
             jnp.arange(64)[None], jnp.ones((1,), jnp.int32))
    # A jitted init compiles once instead of dispatching every op of the scan eagerly.
    init = jax.jit(lambda key: nn.meta.unbox(model.init(key, *dummy)["params"]))
    params = init(jax.random.key(np.random.default_rng().integers(1 << 30)))

    def apply_fn(p, *inputs):
        return model.apply({"params": p}, *inputs)

    rng = np.random.default_rng()
    prompts = [rng.integers(0, 256, n).astype(np.int32) for n in (90, 150)]
    answers = [rng.integers(0, 256, n).astype(np.int32) for n in (5, 9)]
    one = harness.Scorer(apply_fn, params, TOK, _settings(
        "teacher_forced", batch_size=1, seq_multiple=64)).teacher_forced(prompts, answers)
    two = harness.Scorer(apply_fn, params, TOK, _settings(
        "teacher_forced", batch_size=3, seq_multiple=256)).teacher_forced(prompts, answers)
    np.testing.assert_allclose([n for _, n in one], [n for _, n in two], rtol=1e-5)
    assert 4.0 < one[0][1] < 8.0  # untrained: about log(384) = 5.95 nats per token


def test_restore_params_roundtrip(tmp_path):
    from sparsebalance_jax.training import checkpoint
    from sparsebalance_jax.training.state import TrainState, dummy_inputs, make_optimizer

    cfg = _tiny_config()
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    init = jax.jit(lambda key: nn.meta.unbox(
        model.init(key, *dummy_inputs(1, cfg.attention.block_size))["params"]))
    state = TrainState.create(apply_fn=model.apply, params=init(jax.random.key(7)),
                              tx=make_optimizer(cfg.optimizer, cfg.train.num_steps))
    older = state.replace(params=init(jax.random.key(8)))
    manager = checkpoint.make_manager(str(tmp_path), every=1, keep=2)
    manager.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave(older)))
    manager.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
    step, params = harness.restore_params(cfg, str(tmp_path))  # the newest by default
    assert step == 5
    jax.tree.map(np.testing.assert_array_equal, params, state.params)
    step, params = harness.restore_params(cfg, str(tmp_path), step=2)
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, params, older.params)
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 9"):
        harness.restore_params(cfg, str(tmp_path), step=9)
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        harness.restore_params(cfg, str(tmp_path / "empty"))
    assert not (tmp_path / "empty").exists()  # a mistyped path is not created
    # With the run's config recorded, another model is named before anything is restored.
    checkpoint.record_run_config(str(tmp_path), cfg)
    assert harness.restore_params(cfg, str(tmp_path))[0] == 5
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, rope_theta=123.0))
    with pytest.raises(ConfigError, match=r"model: .*model\.rope_theta: .* -> 123\.0"):
        harness.restore_params(other, str(tmp_path))
    unrolled = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_layers=False))
    assert harness.restore_params(unrolled, str(tmp_path))[0] == 5  # same parameters


def test_summary_table_and_json(tmp_path):
    R = harness.ExampleResult
    results = [R("synthetic", "needle", "1000", 1.0, 0.5, None),
               R("synthetic", "needle", "1000", 0.0, 1.5, None),
               R("synthetic", "needle", "500", 1.0, 0.1, None),
               R("longbench", "trec", "8k+", 0.5, None, "x"),
               R("longbench", "trec", "0-4k", 1.0, None, "y")]
    rows = harness.summarize(results)
    assert [(r["suite"], r["task"], r["bucket"], r["n"], r["score"]) for r in rows] == [
        ("longbench", "trec", "0-4k", 1, 100.0), ("longbench", "trec", "8k+", 1, 50.0),
        ("longbench", "trec", "all", 2, 75.0),
        ("synthetic", "needle", "500", 1, 100.0), ("synthetic", "needle", "1000", 2, 50.0),
        ("synthetic", "needle", "all", 3, 66.67)]
    assert rows[4]["nll"] == pytest.approx(1.0) and rows[0]["nll"] is None
    table = harness.format_table(rows)
    assert "needle" in table and "66.67" in table
    path = tmp_path / "out.json"
    harness.write_json(str(path), settings=_settings("teacher_forced"), rows=rows,
                       results=results, meta={"step": 3})
    payload = json.loads(path.read_text())
    assert payload["step"] == 3 and payload["rows"] == rows
    assert payload["metric"] == harness.TF_METRIC and len(payload["examples"]) == 5


def test_missing_longbench_file_fails_before_scoring(tmp_path):
    request = harness.EvalRequest(
        settings=_settings("teacher_forced"), suite_lengths=(700,), suite_per_cell=1,
        suite_seed=0, suite_tasks=("needle",), longbench_dir=str(tmp_path),
        longbench_tasks=("qasper",), longbench_e=False)

    def never_called(*_):
        raise AssertionError("the model must not run before the data is checked")

    with pytest.raises(FileNotFoundError, match=r"qasper\.jsonl"):
        harness.run(never_called, {}, TOK, request, sources.load_corpus(split="heldout"))


def test_teacher_forced_longbench_answer_too_long_fails_before_scoring(tmp_path):
    row = {"input": "", "context": "A report. " * 100,
           "answers": ["The report says " + "many things. " * 160], "length": 3000,
           "dataset": "gov_report", "language": "en", "all_classes": None, "_id": "g0"}
    (tmp_path / "gov_report.jsonl").write_text(json.dumps(row) + "\n")
    request = harness.EvalRequest(
        settings=_settings("teacher_forced", max_seq_len=4096), suite_lengths=(700,),
        suite_per_cell=1, suite_seed=0, suite_tasks=("needle",), longbench_dir=str(tmp_path),
        longbench_tasks=("gov_report",), longbench_e=False)

    def never_called(*_):
        raise AssertionError("the model must not run before the answers are checked")

    with pytest.raises(ValueError, match=r"'gov_report'.*\['g0'\].*2048 answer tokens \(bytes; "
                                         r"LongBench's 512\).*--mode=greedy"):
        harness.run(never_called, {}, TOK, request, sources.load_corpus(split="heldout"))


def _next_token_oracle(wrong_every: int | None):
    """apply_fn predicting each row's true next token (read from a shifted copy of the row
    it is given, EOS at the end of the segment), except at positions divisible by
    `wrong_every` (if given), where it predicts token 0 with the same confidence."""
    eos = TOK.special.eos

    def host(inputs_BT, segment_ids_BT):
        batch, length = inputs_BT.shape
        logits = np.zeros((batch, length, VOCAB), np.float32)
        for b in range(batch):
            n = int(segment_ids_BT[b].sum())
            nxt = np.full(length, eos, np.int32)
            if n:  # filler rows of a short batch hold no segment
                nxt[: n - 1] = inputs_BT[b, 1:n]
            if wrong_every:
                nxt[::wrong_every] = 0
            logits[b, np.arange(length), nxt] = 30.0
        return logits

    return _host_apply_fn(host)


def test_heldout_text_is_scored_on_every_token():
    heldout = sources.load_corpus(split="heldout")
    docs = harness.heldout_text(heldout, TOK, lengths=(300, 700), per_cell=3, seed=5)
    assert sorted(docs) == [300, 700]
    assert all(len(d) == n + 1 and d[0] == TOK.special.bos and d[-1] == TOK.special.eos
               for n, ds in docs.items() for d in ds)
    perfect = harness.evaluate_text(
        harness.Scorer(_next_token_oracle(None), {}, TOK, _settings("greedy")), docs)
    assert [r.score for r in perfect] == [1.0] * 6 and max(r.nll for r in perfect) < 1e-6
    # Every 4th position wrong: position 0 and each multiple of 4 below n miss.
    partly = harness.evaluate_text(
        harness.Scorer(_next_token_oracle(4), {}, TOK, _settings("teacher_forced")), docs)
    for r in partly:
        n = int(r.bucket)
        missed = -(-n // 4)
        assert r.suite == "text" and r.score == pytest.approx(1 - missed / n)
        assert r.nll == pytest.approx(30.0 * missed / n, rel=1e-4)


def test_heldout_split_is_disjoint_from_training():
    train = sources.load_corpus(split="train")
    heldout = sources.load_corpus(split="heldout")
    every = sources.load_corpus(split="all")
    assert set(train.articles).isdisjoint(heldout.articles)
    assert sorted(train.articles + heldout.articles) == sorted(every.articles)
    assert len(heldout.articles) == -(-len(every.articles) // sources.HELDOUT_EVERY)
    with pytest.raises(ValueError, match="split"):
        sources.load_corpus(split="test")


def test_default_suite_lengths_fit_every_row():
    assert harness.default_suite_lengths(1024) == (800, 984)
    assert harness.default_suite_lengths(32768) == (8192, 16384, 32480)
    heldout = sources.load_corpus(split="heldout")
    seed = int(np.random.default_rng().integers(2**31))
    for max_seq_len in (1024, 8192, 32768):
        items = suite.build_suite(heldout.articles, seed=seed, per_cell=4,
                                  lengths=harness.default_suite_lengths(max_seq_len))
        # Greedy rows are the longest: BOS USER prompt ASSISTANT, then answer + slack.
        longest = max(len(TOK.encode(it.example.prompt)) + 3 + len(TOK.encode(it.example.answer))
                      + harness.SUITE_SLACK for it in items)
        assert longest <= max_seq_len


def test_eval_command_writes_text_and_suite_rows(tmp_path):
    """The README's evaluation command end to end (fresh parameters, tiny suite)."""
    import subprocess
    import sys

    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "experiments.eval", "--config=configs/longbench.py:cpu",
           "--checkpoint=init", "--suite_lengths=800", "--suite_per_cell=1",
           "--suite_tasks=needle", "--text_lengths=128,256", "--text_per_cell=2",
           f"--output={out}", "--config.attention.implementation=reference",
           "--config.balance.dst=False", "--config.model.num_layers=1"]
    root = pathlib.Path(__file__).parent.parent
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(out.read_text())
    cells = {(r["suite"], r["task"], r["bucket"]): r["n"] for r in payload["rows"]}
    assert cells[("synthetic", "needle", "800")] == 1
    assert cells[("text", "heldout_wiki", "128")] == 2
    assert cells[("text", "heldout_wiki", "all")] == 4
    assert "heldout_wiki" in done.stdout
