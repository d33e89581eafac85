"""Main config: MoBA attention + SparseBalance (SAB batching, DST tuning) on long documents.

Command:
    python -m experiments.train --config=configs/longbench.py            # preset by machine
    python -m experiments.train --config=configs/longbench.py:cpu        # force the CPU preset
    python -m experiments.train --config=configs/longbench.py --config.train.num_steps=50

Presets:
  gpu: a Qwen2.5-0.5B-shaped decoder (24 layers, d 896, 14/2 heads, head_dim 64, SwiGLU 4864,
       RoPE theta 1e6) at 32K context, MoBA block 512, base top-k 3, on one H200 or more
       (the Hopper MoBA kernels; on other GPUs add --config.attention.moba_backend=triton).
  cpu: the same architecture scaled down (4 layers, d 128, 4/2 heads x 32) at 1K context,
       block 64, on 2 host devices (data=2) so that DST decides and logs a budget per shard.
       SAB's batches leave these two shards nearly even, so the budgets stay at the base:
       a 120-step run on 2026-12-04 predicted an imbalance (max / mean) of 1.004 on average,
       1.021 at most, no shard's gap to the anchor beyond both the 2% dead band and half a
       budget block, and ran every step at (3, 3); DST weighed no cut, so it read no gate
       coverage and logged no coverage/ metric.
       `experiments.dst_dry_run` shows its decisions over more shards. It runs 120 steps in
       about 1.5-2.5 minutes on 2 cores (MoBA in Pallas interpret mode; 1 min 39 s wall on an
       idle machine on 2026-12-04); the loss falls from 5.93 (uniform over the 384-entry
       vocabulary: 5.95) to about 2.5 (2.519 at step 120 in a run of 2026-12-04 whose first
       update already moves the weights; 2.542 and 2.553 before, when it had rate 0).

`auto` (the default) picks `gpu` when a CUDA device node exists, else `cpu`; the choice is made
without starting JAX so that the CPU preset can still ask JAX for its host devices.
"""

import glob

import ml_collections


def _has_cuda_device() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def get_config(preset: str = "auto") -> ml_collections.ConfigDict:
    if preset == "auto":
        preset = "gpu" if _has_cuda_device() else "cpu"
    if preset not in ("gpu", "cpu"):
        raise ValueError(f"preset: {preset!r} is not one of 'auto', 'gpu', 'cpu'")
    gpu = preset == "gpu"
    c = ml_collections.ConfigDict()
    c.preset = preset  # Which preset built this config (printed at start).

    c.model = m = ml_collections.ConfigDict()
    m.vocab_size = 384  # Byte tokenizer: 256 bytes + specials, padded to a multiple of 128.
    m.num_layers = 24 if gpu else 4  # Decoder layers.
    m.d_model = 896 if gpu else 128  # Residual width.
    m.num_heads = 14 if gpu else 4  # Query heads.
    m.num_kv_heads = 2  # Key/value heads (GQA groups).
    m.head_dim = 64 if gpu else 32  # Per-head width.
    m.mlp_dim = 4864 if gpu else 384  # SwiGLU hidden width.
    m.rope_theta = 1e6  # RoPE base frequency (Qwen2.5).
    m.rms_eps = 1e-6  # RMSNorm epsilon.
    m.param_dtype = "float32"  # Parameter / master-weight dtype.
    m.compute_dtype = "bfloat16"  # Activation and matmul dtype.
    m.remat = gpu  # Rematerialise each layer in the backward pass (saves activation memory).
    # With remat: what each layer keeps for the backward pass instead of recomputing it, any of
    # "attention" (MoBA's output, softmax statistics, gate selection, layout, sorted q rows) and
    # "mlp" (the SwiGLU's gate and up projections). The gpu preset keeps both: its H200 step
    # 529 -> 465 ms, peak memory 10.5 -> 33.5 GB, growing with data.seq_len (BENCHMARKS.md).
    m.remat_keep = ("attention", "mlp") if gpu else ()
    # Run the layers as one scanned layer (True) or unrolled, one after another, over the same
    # stacked parameters (False: each layer's kept values stay buffers of their own instead of
    # being copied into the scan's stacked buffers). The gpu preset unrolls: its H200 step
    # 460-461 -> 424-428 ms, peak memory 33.5 -> 35.7-36.1 GB, compile 29 -> 47-59 s
    # (BENCHMARKS.md).
    m.scan_layers = not gpu

    c.attention = a = ml_collections.ConfigDict()
    a.implementation = "moba"  # One of: reference (dense jnp), cudnn (dense, GPU), moba.
    a.block_size = 512 if gpu else 64  # MoBA KV block size in tokens.
    a.budget = 3  # Base budget k: blocks attended per query, own block included.
    a.budget_buckets = (4, 8)  # Static k_max values compiled; budgets are data.
    a.layer_budget_scale = ()  # Optional per-layer budget multipliers (one per layer) or empty.
    a.interpret = not gpu  # Run Pallas kernels in interpret mode (CPU).
    # MoBA kernels (forward, dq, dk/dv): triton (Pallas Triton, any GPU and CPU interpret mode)
    # or mosaic (Hopper only: bf16, head_dim 64 or 128, block_size % 128 == 0). The gpu preset's
    # train step is 4% faster with mosaic on an H200 (BENCHMARKS.md); other GPUs need triton.
    a.moba_backend = "mosaic" if gpu else "triton"

    c.data = d = ml_collections.ConfigDict()
    d.seed = 0  # Seed of document sampling and batching.
    d.seq_len = 32768 if gpu else 1024  # Tokens per packed row.
    d.rows_per_micro_batch = 1  # Rows per micro-batch per data shard.
    d.micro_batches = 2  # Micro-batches per step (gradient accumulation).
    d.text_weight = 0.6  # Share of plain Wikipedia text documents.
    d.synthetic_weight = 0.4  # Share of synthetic long-context retrieval tasks.
    d.jsonl_weight = 0.0  # Share of local jsonl conversations (needs data.jsonl_paths).
    d.jsonl_paths = ()  # LongAlign / ChatQA2-style jsonl files.
    d.synthetic_tasks = ("needle", "multikey", "vartrack")  # Synthetic task mix.
    d.length_distribution = "longalign"  # longalign (long tail), chatqa2 (bimodal), uniform, fixed.
    d.length_scale = 1.0 if gpu else 1 / 32  # Scales longalign / chatqa2 lengths (64-72K at 1).
    d.min_doc_len = 256 if gpu else 64  # Shortest drawn document length (not jsonl records).
    # Longest document: drawn lengths are capped here, longer jsonl records cropped (counted).
    d.max_doc_len = 32768 if gpu else 1024
    d.max_bad_lines = 0  # Malformed jsonl lines tolerated before the run fails.
    d.tokenizer = "bytes"  # Tokenizer kind (byte level, no downloads).
    d.batcher = "sab"  # random, lbb (length-based), sab (sparsity-aware).
    d.window = 4  # Global batches the batcher balances at once.

    c.mesh = mesh = ml_collections.ConfigDict()
    mesh.data = -1  # Data-parallel axis; -1 takes the devices the others leave.
    mesh.fsdp = 1  # Fully-sharded data-parallel axis (parameters sharded, batch split).
    mesh.tensor = 1  # Tensor-parallel axis (heads and MLP split).
    if not gpu:
        mesh.data = 2

    c.optimizer = o = ml_collections.ConfigDict()
    o.learning_rate = 3e-4 if gpu else 3e-3  # Peak AdamW learning rate.
    o.warmup_steps = 100 if gpu else 10  # Linear warm-up steps.
    o.min_lr_ratio = 0.1  # Cosine decay floor as a fraction of the peak.
    o.weight_decay = 0.1  # Decoupled weight decay (not on norms).
    o.b1 = 0.9  # Adam beta1.
    o.b2 = 0.95  # Adam beta2.
    o.eps = 1e-8  # Adam epsilon.
    o.grad_clip_norm = 1.0  # Global gradient-norm clip.

    c.balance = b = ml_collections.ConfigDict()
    b.dst = True  # Dynamic sparsity tuning of per-shard budgets.
    b.anchor = "mean"  # Latency anchor: mean, min or max of the shards' predictions.
    b.p = 0.3  # Largest budget change: p x base budget, rounded up to whole blocks.
    b.coverage_floor = 0.5  # Keep at least this share of the gate's score mass per shard.
    # The floor's coverage probe scores the queries of every probe_stride-th token only (a
    # systematic sample; about 1/stride of its query-side work). 1: every token.
    b.probe_stride = 8
    b.latency_model = "analytic"  # analytic (FLOP counts) or profiled (measured table, below).
    b.latency_table = "latency_tables"  # Folder of profiled tables, one per device and shape.
    # EMA decay of the per-shard measured/predicted correction; it is fed where per-shard times
    # are measured: experiments/bench_balance.py, and the loop with balance.shard_timing.
    b.ema_decay = 0.9
    # Least relative gap to the anchor that moves a shard's budget; where per-shard times are
    # measured, the larger of this and the EMA of the shard's prediction error applies.
    b.dead_band = 0.02
    # Raise light shards only within the base budget's bucket: a larger k_max slows every shard
    # of the step (1-4% at 32K on an H200), and a raise only buys the light shard accuracy.
    b.raise_within_bucket = True
    # Time each data shard's compute every step (a two-program step: local gradients, then the
    # all-reduce and update; training/step.py), log it and feed it to the tuner's EMA. Needs
    # mesh.fsdp = mesh.tensor = 1 and one process. On GPUs each device's own clock times its
    # shard (on two H200s equal shards read within 0.3%); on CPU the completion as the host
    # sees it, where host devices finish together and the times say nothing. Off by default,
    # since it needs that mesh and one process; its cost is small: on two H200s with the gpu
    # preset the split step took 533.0 ms against the one-program step's 532.2 (BENCHMARKS.md).
    b.shard_timing = False

    c.train = t = ml_collections.ConfigDict()
    t.num_steps = 2000 if gpu else 120  # Optimizer steps.
    t.seed = 0  # Parameter-init seed.
    t.workdir = "runs/longbench-" + preset  # Checkpoints and TensorBoard logs go here.
    t.checkpoint_every = 200 if gpu else 40  # Steps between checkpoints.
    t.checkpoint_keep = 3  # Checkpoints kept.
    t.log_every = 10 if gpu else 5  # Steps between TensorBoard writes (metrics.jsonl: each).
    # Resume from a workdir whose run.json (the config that wrote it) differs: the changed
    # fields are printed and recorded; off, a resume with another config stops naming them.
    t.resume_with_changes = False
    return c
