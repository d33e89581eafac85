"""Scoring a model on the synthetic suite and on LongBench; the result table and JSON.

Inputs are laid out exactly as the training data lays out a task (see
`sparsebalance_jax.data.documents.chat_tokens`): BOS, USER, prompt, ASSISTANT, then the
answer and EOS. Two modes:

- teacher_forced (default): one forward pass over prompt + answer + EOS. An example is
  correct when the greedy argmax at every answer position equals the answer token,
  EOS included (exact match of the whole answer span, so also "stops after it"); the
  mean answer-token NLL (nats/token, over the same span) is reported beside it.
- greedy: decode each example up to its own token budget (a synthetic item: its answer's
  length + 8; a LongBench example: its task's), stopping at EOS or at any other special
  token (a role token closes an assistant turn in multi-turn training data; PAD and BOS are
  never an answer's). There is no KV cache:
  each new token re-runs the full forward pass over a fixed padded buffer, so a
  decode costs O(new tokens x sequence) work; that is why teacher forcing is the
  default. Synthetic items are then scored by normalised exact match of the first
  line, LongBench items by the task's LongBench metric.

The held-out text suite ("text") is language-model loss on Wikipedia articles that training
never draws (`sources.load_corpus(split="heldout")`): documents of the requested lengths, laid
out as training lays out text (BOS, tokens, EOS), scored on every target token. Its "nll" is
the mean per-token NLL (nats) and its "score" the next-token top-1 accuracy; it is the same
in both modes. Documents of one length bucket have equal length, so a bucket's row is the
per-token mean; the "all" row averages the documents, each weighing the same.

Rows are right-padded to a multiple of `seq_multiple` (the attention block size) with
PAD tokens in segment 0; attention is causal and never crosses segments, so padding
does not change the logits of real tokens. One jitted program per padded shape.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sparsebalance_jax.data.tokenizer import Tokenizer
from sparsebalance_jax.eval import longbench, metrics, suite
from sparsebalance_jax.jsonfile import write_json as write_json_file

MODES = ("teacher_forced", "greedy")
SUITE_SLACK = 8  # greedy new tokens past a synthetic item's answer
TF_METRIC = "exact match of greedy argmax over answer+EOS under teacher forcing (x100)"

# apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B) -> logits_BTV float32.
ApplyFn = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    mode: str  # one of MODES
    batch_size: int  # rows per forward pass
    seq_multiple: int  # padded lengths are multiples of this (the attention block size)
    min_seq_len: int  # shortest padded row: MoBA needs at least k_max blocks
    budget: int  # MoBA budget (blocks per query) given to every row
    max_seq_len: int  # longest row the model is run on; longer LongBench prompts are
    # truncated in the middle, a longer synthetic item is an error

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {MODES}")
        if min(self.batch_size, self.seq_multiple, self.min_seq_len, self.max_seq_len) < 1:
            raise ValueError("batch_size, seq_multiple, min_seq_len and max_seq_len must be "
                             "positive")


@dataclasses.dataclass(frozen=True)
class ExampleResult:
    suite: str  # "synthetic", "text" or "longbench"
    task: str
    bucket: str  # synthetic: target length in characters; LongBench: LongBench-E bucket
    score: float  # in [0, 1]
    nll: float | None  # mean answer-token NLL (teacher_forced only)
    prediction: str | None  # decoded text (greedy only)


class Scorer:
    """Jitted forward passes of one model: teacher-forced statistics and greedy steps."""

    def __init__(self, apply_fn: ApplyFn, params: Any, tokenizer: Tokenizer,
                 settings: EvalSettings):
        self.params = params
        self.tokenizer = tokenizer
        self.settings = settings

        def tf_stats(params, inputs_BT, segment_ids_BT, positions_BT, budget_B, targets_BT,
                     mask_BT):
            logits_BTV = apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B)
            logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
            gold_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
            nll_B = jnp.sum((logz_BT - gold_BT) * mask_BT, axis=-1)
            wrong_B = jnp.sum((jnp.argmax(logits_BTV, axis=-1) != targets_BT) & (mask_BT > 0),
                              axis=-1)
            return nll_B, wrong_B, jnp.sum(mask_BT, axis=-1)

        def next_tokens(params, inputs_BT, segment_ids_BT, positions_BT, budget_B, last_B):
            logits_BTV = apply_fn(params, inputs_BT, segment_ids_BT, positions_BT, budget_B)
            rows_B = jnp.arange(logits_BTV.shape[0])
            return jnp.argmax(logits_BTV[rows_B, last_B], axis=-1).astype(jnp.int32)

        self._tf_stats = jax.jit(tf_stats)
        self._next_tokens = jax.jit(next_tokens)

    def _prompt_ids(self, prompt_ids: np.ndarray) -> np.ndarray:
        s = self.tokenizer.special
        return np.concatenate([[s.bos, s.user], prompt_ids, [s.assistant]]).astype(np.int32)

    def _padded(self, n: int) -> int:
        m = self.settings.seq_multiple
        return max(-(-n // m) * m, self.settings.min_seq_len)

    def _layout(self, rows: Sequence[np.ndarray], length: int):
        """Right-padded tokens, segment ids (1 real, 0 pad) and positions, all [B, T]."""
        batch = self.settings.batch_size
        tokens_BT = np.full((batch, length), self.tokenizer.special.pad, np.int32)
        segment_ids_BT = np.zeros((batch, length), np.int32)
        for b, row in enumerate(rows):
            tokens_BT[b, : len(row)] = row
            segment_ids_BT[b, : len(row)] = 1
        positions_BT = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
        budget_B = np.full((batch,), self.settings.budget, np.int32)
        return tokens_BT, segment_ids_BT, positions_BT, budget_B

    def span_stats(self, seqs: Sequence[np.ndarray], spans: Sequence[tuple[int, int]]
                   ) -> list[tuple[int, float, int]]:
        """(wrong argmax count, summed NLL, scored tokens) per sequence: one forward pass over
        seq[:-1] predicting seq[1:], scored on target indices [lo, hi) of its span."""
        for s in seqs:
            if len(s) - 1 > self.settings.max_seq_len:
                raise ValueError(f"example of {len(s) - 1} tokens exceeds max_seq_len="
                                 f"{self.settings.max_seq_len}")
        out: list[tuple[int, float, int]] = []
        for start in range(0, len(seqs), self.settings.batch_size):
            chunk = seqs[start : start + self.settings.batch_size]
            length = self._padded(max(len(s) - 1 for s in chunk))
            inputs_BT, seg_BT, pos_BT, budget_B = self._layout([s[:-1] for s in chunk], length)
            targets_BT = np.zeros_like(inputs_BT)
            mask_BT = np.zeros(inputs_BT.shape, np.float32)
            for b, s in enumerate(chunk):
                targets_BT[b, : len(s) - 1] = s[1:]
                lo, hi = spans[start + b]
                mask_BT[b, lo:hi] = 1.0
            nll_B, wrong_B, count_B = jax.device_get(self._tf_stats(
                self.params, inputs_BT, seg_BT, pos_BT, budget_B, targets_BT, mask_BT))
            out += [(int(wrong_B[b]), float(nll_B[b]), int(count_B[b])) for b in range(len(chunk))]
        return out

    def teacher_forced(self, prompts: Sequence[np.ndarray], answers: Sequence[np.ndarray]
                       ) -> list[tuple[bool, float]]:
        """(exact match, mean NLL) per example; answers are scored with EOS appended."""
        eos = self.tokenizer.special.eos
        seqs, spans = [], []
        for p, a in zip(prompts, answers, strict=True):
            ctx = self._prompt_ids(p)
            full = np.concatenate([ctx, a, [eos]]).astype(np.int32)
            seqs.append(full)
            spans.append((len(ctx) - 1, len(full) - 1))  # target indices of answer + EOS
        return [(wrong == 0, nll / count)
                for wrong, nll, count in self.span_stats(seqs, spans)]

    def greedy(self, prompts: Sequence[np.ndarray], max_new_tokens: Sequence[int]
               ) -> list[np.ndarray]:
        """Generated ids per prompt, at most max_new_tokens[i] for prompt i (the first special
        token - EOS, a role, PAD or BOS - and everything after it dropped). Each row stops at its
        own budget, so a short answer's prompt need not leave room for the longest answer of
        its batch."""
        if len(max_new_tokens) != len(prompts):
            raise ValueError(f"{len(max_new_tokens)} token budgets for {len(prompts)} prompts")
        stops = set(dataclasses.astuple(self.tokenizer.special))
        ctxs = [self._prompt_ids(p) for p in prompts]
        for i, (ctx, n) in enumerate(zip(ctxs, max_new_tokens)):
            if len(ctx) + n > self.settings.max_seq_len:
                raise ValueError(f"prompt {i}: {len(ctx)} tokens + {n} new tokens = "
                                 f"{len(ctx) + n} exceeds max_seq_len={self.settings.max_seq_len}")
        out: list[np.ndarray] = []
        for start in range(0, len(ctxs), self.settings.batch_size):
            chunk = ctxs[start : start + self.settings.batch_size]
            budgets = max_new_tokens[start : start + self.settings.batch_size]
            longest = max(len(c) + n for c, n in zip(chunk, budgets))
            tokens_BT, seg_BT, pos_BT, budget_B = self._layout(chunk, self._padded(longest))
            lengths_B = np.array([len(c) for c in chunk] + [1] * (len(budget_B) - len(chunk)))
            done_B = np.arange(len(budget_B)) >= len(chunk)  # filler rows of a short batch
            generated: list[list[int]] = [[] for _ in chunk]
            for _ in range(max(budgets)):
                next_B = np.asarray(self._next_tokens(
                    self.params, tokens_BT, seg_BT, pos_BT, budget_B, lengths_B - 1))
                for b in range(len(chunk)):
                    if done_B[b]:
                        continue
                    if int(next_B[b]) in stops:
                        done_B[b] = True
                        continue
                    generated[b].append(int(next_B[b]))
                    tokens_BT[b, lengths_B[b]] = next_B[b]
                    seg_BT[b, lengths_B[b]] = 1
                    lengths_B[b] += 1
                    done_B[b] = len(generated[b]) == budgets[b]
                if done_B.all():
                    break
            out += [np.asarray(g, np.int32) for g in generated]
        return out


def evaluate_suite(scorer: Scorer, items: Sequence[suite.SuiteItem]) -> list[ExampleResult]:
    tok = scorer.tokenizer
    prompts = [tok.encode(it.example.prompt) for it in items]
    if scorer.settings.mode == "teacher_forced":
        stats = scorer.teacher_forced(prompts, [tok.encode(it.example.answer) for it in items])
        return [ExampleResult("synthetic", it.task, str(it.target_chars), float(ok), nll, None)
                for it, (ok, nll) in zip(items, stats)]
    # Each item's answer plus slack for a stray prefix; only the first line is scored.
    budgets = [len(tok.encode(it.example.answer)) + SUITE_SLACK for it in items]
    texts = [tok.decode(ids) for ids in scorer.greedy(prompts, budgets)]
    correct = suite.score_predictions(items, texts)
    return [ExampleResult("synthetic", it.task, str(it.target_chars), float(ok), None, text)
            for it, ok, text in zip(items, correct, texts)]


def evaluate_text(scorer: Scorer, docs_by_length: dict[int, Sequence[np.ndarray]]
                  ) -> list[ExampleResult]:
    """Per-token NLL and top-1 accuracy of held-out text; `docs_by_length` maps a length
    bucket to token sequences (BOS ... EOS), every target token scored."""
    results = []
    for length, docs in docs_by_length.items():
        stats = scorer.span_stats(docs, [(0, len(d) - 1) for d in docs])
        results += [ExampleResult("text", "heldout_wiki", str(length), 1.0 - wrong / count,
                                  nll / count, None) for wrong, nll, count in stats]
    return results


def heldout_text(corpus, tokenizer: Tokenizer, *, lengths: Sequence[int], per_cell: int,
                 seed: int) -> dict[int, list[np.ndarray]]:
    """`per_cell` held-out text documents of each length (tokens, BOS ... EOS), drawn the
    way training draws text documents, from `corpus` (the held-out split)."""
    from sparsebalance_jax.data.sources import text_document

    out = {}
    for length in lengths:
        rng = np.random.default_rng([seed, int(length)])
        docs = [text_document(corpus, tokenizer, rng, int(length)) for _ in range(per_cell)]
        out[int(length)] = [np.concatenate([d["inputs"], d["targets"][-1:]]).astype(np.int32)
                            for d in docs]
    return out


def _prompt_room(settings: EvalSettings, tokenizer: Tokenizer, task: str) -> int:
    """Tokens a `task` prompt may keep: max_seq_len less the task's answer budget and the
    three specials (BOS, USER, ASSISTANT)."""
    budget = longbench.answer_budget(task, tokenizer.kind)
    room = settings.max_seq_len - budget - 3
    if room <= 0:
        raise ValueError(f"max_seq_len={settings.max_seq_len} leaves no room for a "
                         f"{task!r} prompt after {budget} answer tokens")
    return room


def _gold_answer_ids(tokenizer: Tokenizer, task: str,
                     examples: Sequence[longbench.LongBenchExample]) -> list[np.ndarray]:
    """The first gold answer of each example as ids, as teacher forcing scores it; raises if
    one is longer than the task's answer budget."""
    budget = longbench.answer_budget(task, tokenizer.kind)
    answers = [tokenizer.encode(e.answers[0]) for e in examples]
    too_long = [e.id for e, a in zip(examples, answers) if len(a) > budget]
    if too_long:  # Cutting them would make exact match demand a stop mid-answer.
        raise ValueError(f"LongBench task {task!r}: the gold answers of {len(too_long)} of "
                         f"{len(examples)} examples (ids {too_long[:5]}) exceed the task's "
                         f"{budget} answer tokens ({tokenizer.kind}; LongBench's "
                         f"{longbench.TASKS[task].max_new_tokens}), so teacher forcing cannot "
                         f"score them; score {task} with --mode=greedy (its LongBench metric) or "
                         f"leave it out of --longbench_tasks")
    return answers


def evaluate_longbench(scorer: Scorer, task: str, examples: Sequence[longbench.LongBenchExample]
                       ) -> list[ExampleResult]:
    """Per-example results of one LongBench task. A prompt longer than max_seq_len less the
    answer room is cut in the middle as LongBench's pred.py cuts it: the whole formatted
    prompt, question included (`longbench.truncate_middle`)."""
    tok = scorer.tokenizer
    room = _prompt_room(scorer.settings, tok, task)
    prompts = [np.asarray(longbench.truncate_middle(tok.encode(longbench.build_prompt(e)), room),
                          np.int32) for e in examples]
    buckets = [longbench.length_bucket(e.length) for e in examples]
    if scorer.settings.mode == "teacher_forced":
        stats = scorer.teacher_forced(prompts, _gold_answer_ids(tok, task, examples))
        return [ExampleResult("longbench", task, bk, float(ok), nll, None)
                for bk, (ok, nll) in zip(buckets, stats)]
    spec = longbench.TASKS[task]
    budget = longbench.answer_budget(task, tok.kind)
    texts = [tok.decode(ids) for ids in scorer.greedy(prompts, [budget] * len(prompts))]
    return [
        ExampleResult("longbench", task, bk,
                      metrics.score_example(spec.metric, text, e.answers, task=task,
                                            all_classes=e.all_classes),
                      None, text)
        for e, bk, text in zip(examples, buckets, texts)
    ]


def summarize(results: Sequence[ExampleResult]) -> list[dict]:
    """One row per (suite, task, bucket) and per (suite, task) over all buckets ("all"):
    n, score = 100 x mean, and mean NLL where measured."""
    groups: dict[tuple[str, str, str], list[ExampleResult]] = collections.defaultdict(list)
    for r in results:
        groups[(r.suite, r.task, r.bucket)].append(r)
        groups[(r.suite, r.task, "all")].append(r)

    def bucket_key(b: str):
        # Numeric synthetic lengths sort by value; named LongBench-E buckets by their order.
        names = [n for n, _, _ in longbench.LENGTH_BUCKETS]
        if b == "all":
            return (2, 0)
        return (0, int(b)) if b.isdigit() else (1, names.index(b))

    rows = []
    for (suite_name, task, bucket), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], bucket_key(kv[0][2]))):
        nlls = [r.nll for r in rs if r.nll is not None]
        rows.append({
            "suite": suite_name, "task": task, "bucket": bucket, "n": len(rs),
            "score": round(100.0 * sum(r.score for r in rs) / len(rs), 2),
            "nll": round(float(np.mean(nlls)), 4) if nlls else None,
        })
    return rows


def format_table(rows: Sequence[dict]) -> str:
    header = f"{'suite':<10} {'task':<22} {'bucket':>7} {'n':>5} {'score':>7} {'nll':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        nll = f"{r['nll']:.4f}" if r["nll"] is not None else "-"
        lines.append(f"{r['suite']:<10} {r['task']:<22} {r['bucket']:>7} {r['n']:>5} "
                     f"{r['score']:>7.2f} {nll:>8}")
    return "\n".join(lines)


def write_json(path: str, *, settings: EvalSettings, rows: Sequence[dict],
               results: Sequence[ExampleResult], meta: dict) -> None:
    metric = (TF_METRIC if settings.mode == "teacher_forced" else
              "greedy decoding without KV cache; synthetic: normalised exact match of the "
              "first line (x100); LongBench: the task's LongBench metric (x100)")
    payload = {"settings": dataclasses.asdict(settings), "metric": metric, **meta,
               "rows": list(rows), "examples": [dataclasses.asdict(r) for r in results]}
    write_json_file(path, payload, indent=1, ensure_ascii=False)


def restore_params(cfg, workdir: str, step: int | None = None) -> tuple[int, Any]:
    """Parameters of the checkpoint at `step` (default: the newest) under `workdir`,
    restored onto the first local device whatever mesh they were saved from."""
    import flax.linen as nn
    import orbax.checkpoint as ocp

    from sparsebalance_jax.model import Transformer
    from sparsebalance_jax.training import checkpoint
    from sparsebalance_jax.training.state import TrainState, dummy_inputs, make_optimizer

    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    tx = make_optimizer(cfg.optimizer, cfg.train.num_steps)

    def init(rng):
        variables = model.init(rng, *dummy_inputs(1, cfg.k_max * cfg.attention.block_size))
        return TrainState.create(apply_fn=model.apply, params=nn.meta.unbox(variables["params"]),
                                 tx=tx)

    device = jax.local_devices()[0]
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                       sharding=jax.sharding.SingleDeviceSharding(device)),
        jax.eval_shape(init, jax.random.key(0)))
    folder = os.path.abspath(os.path.join(workdir, "checkpoints"))
    if not os.path.isdir(folder):  # a mistyped path is reported, not created
        raise FileNotFoundError(f"no checkpoint under {folder}")
    checkpoint.check_model_matches_run(workdir, cfg)
    manager = checkpoint.make_manager(workdir, every=cfg.train.checkpoint_every,
                                      keep=cfg.train.checkpoint_keep, create=False)
    available = manager.all_steps()
    if not available:
        raise FileNotFoundError(f"no checkpoint under {manager.directory}")
    step = max(available) if step is None else step
    if step not in available:
        raise FileNotFoundError(f"no checkpoint of step {step} under {manager.directory}; "
                                f"steps there: {sorted(available)}")
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target)))
    return step, restored["state"].params


@dataclasses.dataclass(frozen=True)
class EvalRequest:
    """What to evaluate (everything `experiments.eval` takes besides the config)."""

    settings: EvalSettings
    suite_lengths: tuple[int, ...]  # synthetic target lengths in characters; () skips it
    suite_per_cell: int
    suite_seed: int
    suite_tasks: tuple[str, ...]
    longbench_dir: str  # "" skips LongBench
    longbench_tasks: tuple[str, ...]
    longbench_e: bool  # read <task>_e.jsonl (LongBench-E) instead of <task>.jsonl
    text_lengths: tuple[int, ...] = ()  # held-out text document lengths in tokens; () skips
    text_per_cell: int = 8


def default_suite_lengths(max_seq_len: int) -> tuple[int, ...]:
    """A quarter, a half and (almost) all of the context, at least 800 characters (the
    longest task's facts need ~700).

    Lengths count the characters of prompt + answer; the model runs on byte tokens. The top
    length leaves 32 tokens for the three specials and the greedy slack past the answer, and
    1/128 of the context for the extra bytes of multi-byte characters (held-out Wikipedia
    text has ~0.2% more bytes than characters)."""
    top = max_seq_len - 32 - max_seq_len // 128
    return tuple(sorted({min(top, max(800, max_seq_len // 4)),
                         min(top, max(800, max_seq_len // 2)), top}))


def run(apply_fn: ApplyFn, params: Any, tokenizer: Tokenizer, request: EvalRequest,
        heldout) -> tuple[list[dict], list[ExampleResult]]:
    """Scores every requested suite; returns the summary rows and per-example results.

    `heldout` is the held-out text corpus (`sources.load_corpus(split="heldout")`): the
    synthetic suite's haystack and the text suite's documents."""
    # LongBench files are loaded and checked first: a missing file, or a task this mode cannot
    # score, fails before any model time is spent.
    lb = {t: longbench.load_task(request.longbench_dir, t, longbench_e=request.longbench_e)
          for t in request.longbench_tasks} if request.longbench_dir else {}
    for task, examples in lb.items():
        _prompt_room(request.settings, tokenizer, task)
        if request.settings.mode == "teacher_forced":
            _gold_answer_ids(tokenizer, task, examples)
    scorer = Scorer(apply_fn, params, tokenizer, request.settings)
    results: list[ExampleResult] = []
    if request.suite_lengths:
        items = suite.build_suite(heldout.articles, seed=request.suite_seed,
                                  lengths=request.suite_lengths, per_cell=request.suite_per_cell,
                                  tasks=request.suite_tasks)
        results += evaluate_suite(scorer, items)
    if request.text_lengths:
        results += evaluate_text(scorer, heldout_text(
            heldout, tokenizer, lengths=request.text_lengths, per_cell=request.text_per_cell,
            seed=request.suite_seed))
    for task, examples in lb.items():
        results += evaluate_longbench(scorer, task, examples)
    return summarize(results), results
