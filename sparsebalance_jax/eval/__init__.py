"""Evaluation: LongBench data and metrics, the synthetic long-context suite, the harness.

- `metrics`: LongBench's answer metrics and scoring rules.
- `longbench`: task table (prompt templates, answer budgets, metrics), jsonl loader,
  LongBench-E length buckets.
- `suite`: the seeded synthetic suite over `sparsebalance_jax.data.synthetic` tasks.
- `harness`: scoring a model (teacher-forced or greedy), result table and JSON.
"""
