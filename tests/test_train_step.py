"""The train step's arithmetic against a direct computation: the loss is the mean cross entropy
over the trained tokens of the whole step (all micro-batches together, each token weighing the
same), its gradient that mean's gradient; the optimizer clips, decays and schedules as
configured. (test_sharding compares the step across meshes, which a wrong formula passes.)"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

from sparsebalance_jax.model import Transformer
from sparsebalance_jax.training.state import learning_rate_schedule, make_optimizer
from sparsebalance_jax.training.step import apply_summed_grads, loss_and_grads
from tests.test_model import packed_inputs, tiny_config

M, B, T = 2, 2, 64


def _step_batch(rng):
    """[M, B, T] rows of packed documents, padded at different lengths, with a random loss mask
    over the documents' tokens (0 in padding), so the micro-batches train different counts."""
    tokens, seg, pos = packed_inputs(rng, M * B, T, [0, 20, 40])
    fill_N = rng.integers(24, T + 1, M * B)
    real_NT = np.arange(T)[None, :] < fill_N[:, None]
    seg = np.where(real_NT, np.asarray(seg), 0)
    pos = np.where(real_NT, np.asarray(pos), 0)
    mask = ((rng.random((M * B, T)) < 0.7) & real_NT).astype(np.float32)
    batch = dict(inputs=np.asarray(tokens), targets=rng.integers(0, 256, (M * B, T)),
                 loss_mask=mask, segment_ids=seg, positions=pos,
                 budgets=np.full((M * B,), 2))
    return {k: jnp.asarray(v.reshape(M, B, *v.shape[1:]),
                           jnp.float32 if k == "loss_mask" else jnp.int32)
            for k, v in batch.items()}


def _direct_mean_loss(model, params, batch):
    """Every row of the step in one call; mean negative log-likelihood of the trained targets."""
    rows = {k: v.reshape(M * B, *v.shape[2:]) for k, v in batch.items()}
    logits = model.apply({"params": params}, rows["inputs"], rows["segment_ids"],
                         rows["positions"], rows["budgets"])
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, rows["targets"][..., None], axis=-1)[..., 0]
    return jnp.sum(nll * rows["loss_mask"]) / jnp.sum(rows["loss_mask"])


def test_step_loss_and_gradients_are_the_mean_over_trained_tokens():
    cfg = tiny_config()
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    rng = np.random.default_rng()
    batch = _step_batch(rng)
    counts_M = np.asarray(batch["loss_mask"]).sum(axis=(1, 2))
    params = nn.meta.unbox(model.init(jax.random.key(0), batch["inputs"][0],
                                      batch["segment_ids"][0], batch["positions"][0],
                                      batch["budgets"][0])["params"])
    summed = jax.jit(lambda p, b: loss_and_grads(model, p, b))
    loss_sum, count, grads = summed(params, batch)
    assert float(count) == counts_M.sum()
    want_loss, want_grads = jax.jit(jax.value_and_grad(
        lambda p: _direct_mean_loss(model, p, batch)))(params)
    np.testing.assert_allclose(float(loss_sum) / float(count), float(want_loss), rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        # float32 sums in another order: a few ulps (measured worst 1.3e-6 of max|g|).
        np.testing.assert_allclose(np.asarray(got) / float(count), want, rtol=2e-5,
                                   atol=2e-5 * np.abs(want).max())

    # Untrained targets (masked tokens and padding) do not reach the loss or the gradients.
    untrained = np.asarray(batch["loss_mask"]) == 0
    moved = dict(batch, targets=jnp.where(untrained, (batch["targets"] + 7) % 256,
                                          batch["targets"]))
    loss2, count2, grads2 = summed(params, moved)
    assert float(loss2) == float(loss_sum) and float(count2) == float(count)
    jax.tree.map(np.testing.assert_array_equal, grads2, grads)

    # The update: the summed gradients over the step's trained-token count (plain SGD, lr 1).
    state = TrainState.create(apply_fn=None, params=params, tx=optax.sgd(1.0))
    new_state, metrics = jax.jit(apply_summed_grads)(state, loss_sum, count, grads)
    np.testing.assert_allclose(float(metrics["loss"]), float(want_loss), rtol=1e-5)
    assert float(metrics["tokens"]) == counts_M.sum()
    np.testing.assert_allclose(float(metrics["grad_norm"]),
                               float(optax.tree.norm(want_grads)), rtol=2e-5)
    for new, old, g in zip(*map(jax.tree.leaves, (new_state.params, params, want_grads))):
        # As the gradients above, and the new parameters rounded to float32 (old - new is off
        # by up to an ulp of them).
        np.testing.assert_allclose(
            np.asarray(old) - np.asarray(new), g, rtol=2e-5,
            atol=2e-5 * np.abs(g).max() + 2 * np.spacing(np.abs(np.asarray(old)).max()))


def _opt(**changes):
    return dataclasses.replace(tiny_config().optimizer, **changes)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    """Update n takes the rate at n + 1: linear to the peak at update warmup_steps - 1, then
    half a cosine down to min_lr_ratio x peak at the last update."""
    opt = _opt(learning_rate=2e-3, warmup_steps=4, min_lr_ratio=0.1)
    steps = 20
    rates = np.array([float(learning_rate_schedule(opt, steps)(n)) for n in range(steps)])
    peak, end = opt.learning_rate, opt.learning_rate * opt.min_lr_ratio
    count = np.arange(1, steps + 1)
    cosine = end + (peak - end) * 0.5 * (1 + np.cos(np.pi * (count - 4) / (steps - 4)))
    want = np.where(count < 4, peak * count / 4, cosine)
    np.testing.assert_allclose(rates, want, rtol=1e-5)
    assert rates[3] == np.float32(peak) and abs(rates[-1] - end) < 1e-6 * peak


def test_without_warm_up_the_first_update_takes_the_peak():
    """warmup_steps=0: the cosine runs from the peak at update 0 to min_lr_ratio x peak at the
    last update (shifted by one as the warm-up is, it skipped the peak)."""
    opt = _opt(learning_rate=1.0, warmup_steps=0, min_lr_ratio=0.1)
    steps = 5
    rates = np.array([float(learning_rate_schedule(opt, steps)(n)) for n in range(steps)])
    n = np.arange(steps)
    np.testing.assert_allclose(rates, 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * n / (steps - 1))),
                               rtol=1e-6)
    assert rates[0] == 1.0


def test_optimizer_clips_the_global_norm_before_adam():
    """Clipping runs first: gradients of global norm 50 update as those scaled to the clip norm.
    A huge Adam eps keeps the first update proportional to its input (-lr g / (|g| + eps))."""
    opt = _opt(grad_clip_norm=1.0, eps=1e6, weight_decay=0.0, warmup_steps=0)
    tx = make_optimizer(opt, 10)
    rng = np.random.default_rng()
    params = {"w": jnp.zeros((8, 4)), "v": jnp.zeros((5,))}
    g = {"w": jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
         "v": jnp.asarray(rng.standard_normal(5), jnp.float32)}
    g = jax.tree.map(lambda x: x * 50.0 / optax.tree.norm(g), g)
    updates, _ = tx.update(g, tx.init(params), params)
    lr = float(learning_rate_schedule(opt, 10)(0))
    clipped = jax.tree.map(lambda x: x / 50.0, g)
    jax.tree.map(lambda u, c: np.testing.assert_allclose(u, -lr * c / (np.abs(c) + opt.eps),
                                                         rtol=1e-4), updates, clipped)


def test_weight_decay_skips_norm_scales_and_biases():
    """With zero gradients the update is the decay alone: kernels and the embedding shrink by
    lr x weight_decay, norm scales and biases do not move."""
    opt = _opt(weight_decay=0.1, warmup_steps=0)
    tx = make_optimizer(opt, 10)
    params = {"layers": {"attn": {"q": {"kernel": jnp.full((4, 2), 2.0),
                                        "bias": jnp.full((2,), 3.0)}},
                         "attn_norm": {"scale": jnp.ones((4,))}},
              "embed": {"embedding": jnp.full((3, 4), -1.0)}}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    lr = float(learning_rate_schedule(opt, 10)(0))
    np.testing.assert_allclose(updates["layers"]["attn"]["q"]["kernel"], -lr * 0.1 * 2.0,
                               rtol=1e-5)
    np.testing.assert_allclose(updates["embed"]["embedding"], lr * 0.1, rtol=1e-5)
    assert not np.any(updates["layers"]["attn"]["q"]["bias"])
    assert not np.any(updates["layers"]["attn_norm"]["scale"])
