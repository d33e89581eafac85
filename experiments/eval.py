"""Evaluate a checkpoint: held-out text loss, the synthetic suite and (optionally) LongBench.

    python -m experiments.eval --config=configs/longbench.py:cpu --checkpoint=runs/longbench-cpu
    python -m experiments.eval --config=configs/longbench.py --checkpoint=runs/longbench-gpu \
        --mode=greedy --longbench_dir=/path/to/LongBench/data --longbench_tasks=hotpotqa,trec

`--checkpoint` is the training work directory (the one holding checkpoints/); the newest
step is used unless --step is given. `--checkpoint=init` scores freshly initialised
parameters (a smoke test of the pipeline). Default mode is teacher_forced (see
`sparsebalance_jax.eval.harness` for both metrics). Prints a table per task and length
bucket and writes the rows and per-example results as JSON to --output.
"""

import dataclasses
import os

from absl import flags, logging
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Training workdir, or 'init'.",
                                  required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: newest).")
_MODE = flags.DEFINE_enum("mode", "teacher_forced", ["teacher_forced", "greedy"], "Scoring.")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Rows per forward pass.")
_BUDGET = flags.DEFINE_integer("budget", None, "MoBA budget (default: attention.budget).")
_MAX_LEN = flags.DEFINE_integer("max_seq_len", None, "Longest row (default: data.seq_len).")
_LENGTHS = flags.DEFINE_list("suite_lengths", None,
                             "Synthetic lengths in characters (default: 1/4, 1/2 and nearly "
                             "all of max_seq_len, each at least 800, leaving room for each "
                             "row's answer; equal ones merge); 'none' skips the suite.")
_PER_CELL = flags.DEFINE_integer("suite_per_cell", 8, "Examples per (task, length).")
_SEED = flags.DEFINE_integer("suite_seed", 1234, "Suite seed (training uses data.seed).")
_TASKS = flags.DEFINE_list("suite_tasks", None, "Synthetic tasks (default: all five).")
_TEXT_LENGTHS = flags.DEFINE_list("text_lengths", None,
                                   "Held-out text document lengths in tokens (default: 1/4, 1/2, "
                                   "all of max_seq_len); 'none' skips the text loss.")
_TEXT_PER_CELL = flags.DEFINE_integer("text_per_cell", 8, "Held-out text documents per length.")
_LB_DIR = flags.DEFINE_string("longbench_dir", "", "Folder of LongBench jsonl files.")
_LB_TASKS = flags.DEFINE_list("longbench_tasks", None,
                              "LongBench tasks (default: all of LongBench / LongBench-E).")
_LB_E = flags.DEFINE_bool("longbench_e", False, "Read <task>_e.jsonl (LongBench-E).")
_OUTPUT = flags.DEFINE_string("output", None,
                              "JSON path (default: <checkpoint>/eval_<mode>.json, or "
                              "./eval_<mode>.json for 'init').")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # Keep orbax's restore INFO lines off the console.
    import flax.linen as nn
    import jax

    from sparsebalance_jax.config import check_attention_runs_here, from_config_dict
    from sparsebalance_jax.data import synthetic
    from sparsebalance_jax.data.sources import load_corpus
    from sparsebalance_jax.data.tokenizer import make_tokenizer
    from sparsebalance_jax.eval import harness, longbench
    from sparsebalance_jax.model import Transformer
    from sparsebalance_jax.training.state import dummy_inputs

    # Evaluation runs on one device, whatever mesh the model was trained on.
    raw = _CONFIG.value.to_dict()
    raw["mesh"] = {"data": 1, "fsdp": 1, "tensor": 1}
    if _BUDGET.value is not None:  # Validated like any budget; k_max follows its bucket.
        raw["attention"]["budget"] = _BUDGET.value
    cfg = from_config_dict(raw)
    check_attention_runs_here(cfg)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    if _CHECKPOINT.value == "init":
        step = 0
        dummy = dummy_inputs(1, cfg.k_max * cfg.attention.block_size)
        params = jax.jit(lambda key: nn.meta.unbox(model.init(key, *dummy)["params"]))(
            jax.random.key(cfg.train.seed))
    else:
        step, params = harness.restore_params(cfg, _CHECKPOINT.value, _STEP.value)
    max_seq_len = _MAX_LEN.value or cfg.data.seq_len
    settings = harness.EvalSettings(
        mode=_MODE.value, batch_size=_BATCH.value, seq_multiple=cfg.attention.block_size,
        min_seq_len=cfg.k_max * cfg.attention.block_size,
        budget=cfg.attention.budget, max_seq_len=max_seq_len)
    if _LENGTHS.value == ["none"]:
        lengths = ()
    elif _LENGTHS.value:
        lengths = tuple(int(x) for x in _LENGTHS.value)
    else:
        lengths = harness.default_suite_lengths(max_seq_len)
    if _TEXT_LENGTHS.value == ["none"]:
        text_lengths = ()
    elif _TEXT_LENGTHS.value:
        text_lengths = tuple(int(x) for x in _TEXT_LENGTHS.value)
    else:
        text_lengths = tuple(sorted({max_seq_len // 4, max_seq_len // 2, max_seq_len}))
    default_lb = longbench.LONGBENCH_E_TASKS if _LB_E.value else tuple(longbench.TASKS)
    request = harness.EvalRequest(
        settings=settings, suite_lengths=lengths, suite_per_cell=_PER_CELL.value,
        suite_seed=_SEED.value, suite_tasks=tuple(_TASKS.value or synthetic.TASKS),
        longbench_dir=_LB_DIR.value, longbench_tasks=tuple(_LB_TASKS.value or default_lb),
        longbench_e=_LB_E.value, text_lengths=text_lengths, text_per_cell=_TEXT_PER_CELL.value)

    def apply_fn(params, *inputs):
        return model.apply({"params": params}, *inputs)

    heldout = load_corpus(tokenizer_kind=cfg.data.tokenizer, split="heldout")
    rows, results = harness.run(apply_fn, params, make_tokenizer(cfg.data.tokenizer), request,
                                heldout)
    print(f"checkpoint {_CHECKPOINT.value} step {step}, mode {settings.mode}, "
          f"budget {settings.budget}, attention {cfg.attention.implementation}")
    print(harness.format_table(rows))
    out_dir = "." if _CHECKPOINT.value == "init" else _CHECKPOINT.value
    output = _OUTPUT.value or os.path.join(out_dir, f"eval_{settings.mode}.json")
    harness.write_json(output, settings=settings, rows=rows, results=results,
                       meta={"checkpoint": _CHECKPOINT.value, "step": step,
                             "attention": cfg.attention.implementation,
                             "attention_config": dataclasses.asdict(cfg.attention)})
    print(f"wrote {output}")


if __name__ == "__main__":
    cli.run(main)
