"""Accuracy study: dense vs MoBA (fixed budget) vs SparseBalance, trained and evaluated alike.

    python -m experiments.accuracy_study --out_dir=runs/accuracy_study      # preset by machine
    python -m experiments.accuracy_study --preset=cpu --steps=40 --seeds=0  # quick CPU pass
    python -m experiments.accuracy_study --combine=s0/study.json,s1/study.json --out_dir=both

Trains every (method, seed) arm of `configs/accuracy_study.py`, evaluates each final
checkpoint teacher-forced (held-out text NLL, the synthetic suite), and writes study.json and
study.md (one row per arm, then per method the mean +- half-range over seeds) under
--out_dir. Finished arms are not retrained (their runs resume at the last step) and are
evaluated again. --combine merges the study.json of separate runs (one seed per device call,
say) into one table without training. `sparsebalance_jax.eval.study` documents the arms and
the table.
"""

import os

from absl import flags

from experiments import cli

_METHODS = flags.DEFINE_list("methods", ["dense", "moba", "sparsebalance"], "Study arms.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds (train.seed = data.seed).")
_PRESET = flags.DEFINE_enum("preset", "auto", ["auto", "gpu", "cpu"], "Config preset.")
_STEPS = flags.DEFINE_integer("steps", None, "Training steps (default: the config's).")
_PARALLEL = flags.DEFINE_integer("parallel", 6, "Arms run at once.")
_OUT = flags.DEFINE_string("out_dir", "runs/accuracy_study", "Where arms and the table go.")
_LENGTHS = flags.DEFINE_list("suite_lengths", None,
                             "Synthetic lengths in characters (default: the harness's).")
_PER_CELL = flags.DEFINE_integer("suite_per_cell", 32, "Suite examples per (task, length).")
_TEXT_PER_CELL = flags.DEFINE_integer("text_per_cell", 8, "Held-out text documents per length.")
_EVAL_BATCH = flags.DEFINE_integer("eval_batch_size", 8, "Rows per evaluation forward pass.")
_COMBINE = flags.DEFINE_list("combine", None,
                             "study.json files to merge into one table (no training), e.g. one "
                             "seed per device call.")


def main(argv):
    del argv
    from sparsebalance_jax.eval import study

    os.makedirs(_OUT.value, exist_ok=True)
    if _COMBINE.value:
        results, meta = study.combine_reports(_COMBINE.value)
        paths = study.write_results(_OUT.value, results, meta)
    else:
        paths = _run(study)
    for path in paths:
        print(f"wrote {path}")
    with open(os.path.join(_OUT.value, "study.md")) as f:
        print(f.read())


def _run(study):
    settings = study.StudySettings(
        preset=_PRESET.value, steps=_STEPS.value,
        suite_lengths=tuple(int(x) for x in _LENGTHS.value or ()),
        suite_per_cell=_PER_CELL.value, text_per_cell=_TEXT_PER_CELL.value,
        eval_batch_size=_EVAL_BATCH.value)
    arms = study.plan_arms(_METHODS.value, [int(s) for s in _SEEDS.value], _OUT.value)
    study.run_study(arms, settings, parallel=_PARALLEL.value)
    meta = {"settings": settings.__dict__, "commands": {
        a.name: [" ".join(c) for c in study.arm_commands(a, settings)] for a in arms}}
    return study.write_report(_OUT.value, arms, meta)


if __name__ == "__main__":
    cli.run(main)
