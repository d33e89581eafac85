"""Model invariants: it learns, it is causal, and packed documents do not see each other."""

import collections
import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.longbench import get_config
from sparsebalance_jax.config import from_config_dict
from sparsebalance_jax.model import Transformer, token_losses


def tiny_config(implementation="reference", **model):
    raw = get_config("cpu")
    raw.attention.implementation = implementation
    raw.balance.dst = implementation == "moba"
    raw.attention.block_size = 16
    raw.attention.budget = 2
    raw.attention.budget_buckets = (2, 4)
    raw.data.seq_len = 64
    raw.data.max_doc_len = 64
    raw.data.min_doc_len = 8
    raw.model.update(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16,
                     mlp_dim=128, compute_dtype="float32", **model)
    return from_config_dict(raw)


def packed_inputs(rng, batch, seq_len, doc_starts):
    tokens = jnp.asarray(rng.integers(0, 256, (batch, seq_len)), jnp.int32)
    seg = np.zeros((batch, seq_len), np.int32)
    pos = np.zeros((batch, seq_len), np.int32)
    for b in range(batch):
        bounds = list(doc_starts) + [seq_len]
        for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            seg[b, s:e] = i + 1
            pos[b, s:e] = np.arange(e - s)
    return tokens, jnp.asarray(seg), jnp.asarray(pos)


def test_overfits_a_fixed_batch():
    cfg = tiny_config()
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, 2, 64, [0, 32])
    targets = jnp.roll(tokens, -1, axis=1)
    mask = jnp.ones_like(tokens, jnp.float32)
    budget = jnp.full((2,), 2, jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.key(0), tokens, seg, pos, budget)["params"])
    tx = optax.adam(3e-3)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt):
        def loss_fn(p):
            s, n = token_losses(model.apply({"params": p}, tokens, seg, pos, budget), targets, mask)
            return s / n
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    losses = [float(step(params, opt)[2])]
    for _ in range(150):
        params, opt, loss = step(params, opt)
    losses.append(float(loss))
    assert losses[0] > 5.0  # ~log(384) at init
    assert losses[-1] < 0.5, losses


def _input_grad_norms(cfg, seg, pos, query_index):
    """|d logits[0, query] / d x_t| for every position t of row 0.

    The vocabulary has one entry per position, so each position's input embedding is its own
    parameter row and the embedding-table gradient is the gradient w.r.t. the inputs.
    """
    batch, seq_len = seg.shape
    ids_BT = jnp.arange(batch * seq_len, dtype=jnp.int32).reshape(batch, seq_len)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    budget = jnp.full((batch,), cfg.k_max, jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.key(1), ids_BT, seg, pos, budget)["params"])

    def f(p):
        return model.apply({"params": p}, ids_BT, seg, pos, budget)[0, query_index].sum()

    g_VE = jax.grad(f)(params)["embed"]["embedding"]
    return np.asarray(jnp.linalg.norm(g_VE[:seq_len], axis=-1))


@pytest.mark.parametrize("implementation", ["reference", "moba"])
def test_causal_and_no_cross_document_dependence(implementation):
    cfg = tiny_config(implementation)
    # One vocabulary entry per position (no tokenizer involved, so past config validation).
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=2 * 64))
    # Document 2 starts inside a block (block 16: tokens 32..47 hold both documents), so the
    # same-document mask, not the block boundaries, is what keeps document 1 out.
    _, seg, pos = packed_inputs(np.random.default_rng(), 2, 64, [0, 40])
    q = 44  # inside document 2 (tokens 40..63)
    norms = _input_grad_norms(cfg, seg, pos, q)
    assert np.all(norms[q + 1:] == 0.0), "a later token influenced an earlier output"
    assert np.all(norms[:40] == 0.0), "document 1 influenced document 2"
    assert np.all(norms[40:q + 1] > 0.0)


@pytest.mark.parametrize("implementation", ["reference", "moba"])
def test_logits_do_not_change_with_later_tokens_or_other_documents(implementation):
    """What gradients cannot show: MoBA's block selection is piecewise constant, so a later
    token or another document that changed which blocks a query reads would pass the gradient
    check above. Here the tokens themselves change: every logit at or before p, and every
    logit of the other document, must stay bit for bit. Blocks of 16, budget 2 of up to 4
    blocks: row 0 is one document (a query in block 3 picks one of 3 earlier blocks), row 1
    two, the second starting inside block 1 (its queries pick among blocks holding both)."""
    cfg = tiny_config(implementation)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, 2, 64, [0])
    _, seg1, pos1 = packed_inputs(rng, 1, 64, [0, 20])
    seg, pos = jnp.concatenate([seg[:1], seg1]), jnp.concatenate([pos[:1], pos1])
    budget = jnp.full((2,), 2, jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.key(0), tokens, seg, pos, budget)["params"])
    logits = jax.jit(lambda t: model.apply({"params": params}, t, seg, pos, budget))
    base = np.asarray(logits(tokens))

    def other(tokens, where_BT):
        fresh = jnp.asarray(rng.integers(0, 256, tokens.shape), jnp.int32)
        return jnp.where(where_BT, (tokens + 1 + fresh % 255) % 256, tokens)  # every one moves

    for p in (20, 47, 50, 60):
        later = np.broadcast_to(np.arange(64) > p, (2, 64))
        moved = np.asarray(logits(other(tokens, later)))
        np.testing.assert_array_equal(moved[:, :p + 1], base[:, :p + 1], err_msg=f"p={p}")
        assert np.abs(moved[:, p + 1:] - base[:, p + 1:]).max() > 0  # the change reached them
    first_doc = np.zeros((2, 64), bool)
    first_doc[1, :20] = True
    moved = np.asarray(logits(other(tokens, first_doc)))
    np.testing.assert_array_equal(moved[1, 20:], base[1, 20:])
    np.testing.assert_array_equal(moved[0], base[0])


@pytest.mark.parametrize("stride", [1, 5])
def test_first_layer_qk_are_the_first_layers_gate_inputs(monkeypatch, stride):
    """first_layer_qk (the DST coverage probe's inputs) gives the q and k that the first
    layer's attention receives, q at every stride-th token."""
    from sparsebalance_jax.model import first_layer_qk
    from sparsebalance_jax.model import transformer

    cfg = tiny_config("moba", scan_layers=False)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, 2, 64, [0, 40])
    budget = jnp.full((2,), 2, jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.key(0), tokens, seg, pos, budget)["params"])
    seen = []

    def recording(q_BTHD, k_BTKD, *args, **kwargs):
        jax.debug.callback(lambda q, k: seen.append((np.asarray(q), np.asarray(k))), q_BTHD,
                           k_BTKD, ordered=True)
        return attention_op(q_BTHD, k_BTKD, *args, **kwargs)

    attention_op = transformer.attention_op
    monkeypatch.setattr(transformer, "attention_op", recording)
    jax.block_until_ready(model.apply({"params": params}, tokens, seg, pos, budget))
    jax.effects_barrier()
    assert len(seen) == cfg.model.num_layers
    q_BSHD, k_BTKD = first_layer_qk(model, params, tokens, pos, stride)
    # float32, computed by differently fused programs: rounding apart, not more.
    np.testing.assert_allclose(np.asarray(q_BSHD), seen[0][0][:, ::stride], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(k_BTKD), seen[0][1], rtol=1e-5, atol=1e-6)
    assert np.abs(seen[0][0] - seen[1][0]).max() > 1e-2, "layers 0 and 1 see different q"


@pytest.mark.parametrize("stride", [1, 4])
def test_coverage_probe_is_each_shards_token_weighted_coverage(stride):
    """launch.CoverageProbe: shard s's column k - 1 is its rows' first-layer gate coverage at
    budget k - each row's mean over its sampled non-padding tokens (every stride-th; at stride
    1, moba_coverage) - weighted by the rows' non-padding tokens; rows of different fill, one
    of padding only."""
    from pallas_kernels.moba import moba_coverage, moba_gate
    from sparsebalance_jax.model import first_layer_qk
    from sparsebalance_jax.training.launch import CoverageProbe

    cfg = tiny_config("moba")
    cfg = dataclasses.replace(cfg, balance=dataclasses.replace(cfg.balance, probe_stride=stride))
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, 4, 64, [0, 20])
    fill_N = np.array([64, 47, 0, 64])  # row 2: padding only
    seg = jnp.where(jnp.arange(64)[None, :] < fill_N[:, None], seg, 0)
    budget = jnp.full((4,), 2, jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.key(0), tokens, seg, pos, budget)["params"])
    batch = {"inputs": np.asarray(tokens).reshape(2, 1, 2, 64),
             "segment_ids": np.asarray(seg).reshape(2, 1, 2, 64),
             "positions": np.asarray(pos).reshape(2, 1, 2, 64)}
    got_SK = np.asarray(CoverageProbe(cfg, model)(batch, params))
    k_max, block = cfg.attention.budget, cfg.attention.block_size
    assert got_SK.shape == (2, k_max)
    q, k = first_layer_qk(model, params, tokens, pos)
    tokens_N = (np.asarray(seg) > 0).sum(1)
    sampled_NT = np.asarray(seg)[:, ::stride] > 0
    for budget in range(1, k_max + 1):
        budget_N = jnp.full((4,), budget, jnp.int32)
        per_token_NT = np.asarray(moba_gate(q, k, seg, budget_N, block_size=block, k_max=k_max)
                                  .coverage_BTG, np.float64).mean(-1)[:, ::stride]
        row_N = np.where(sampled_NT.any(1), (per_token_NT * sampled_NT).sum(1)
                         / np.maximum(sampled_NT.sum(1), 1), 1.0)
        if stride == 1:
            np.testing.assert_allclose(row_N, np.asarray(moba_coverage(
                q, k, seg, budget_N, block_size=block, k_max=k_max)), rtol=1e-5, atol=1e-6)
        want_S = (row_N * tokens_N).reshape(2, 2).sum(1) / tokens_N.reshape(2, 2).sum(1)
        np.testing.assert_allclose(got_SK[:, budget - 1], want_S, rtol=1e-5, atol=1e-6)
    assert got_SK[:, 1].max() < 0.999, "budget 2 should leave gate mass unchosen"


def test_moba_backend_choice_reaches_the_layers():
    """attention.moba_backend='mosaic' runs the Hopper kernels (GPU interpret mode here) in
    every layer; the logits match the Triton kernels' within bf16 rounding."""
    raw = get_config("cpu")
    raw.attention.update(implementation="moba", block_size=128, budget=2, budget_buckets=(2,))
    raw.balance.dst = False
    raw.data.update(seq_len=256, max_doc_len=256, min_doc_len=8)
    raw.model.update(num_layers=1, d_model=128, num_heads=2, num_kv_heads=1, head_dim=64,
                     mlp_dim=128, compute_dtype="bfloat16")
    rng = np.random.default_rng()
    ids, seg, pos = packed_inputs(rng, 2, 256, [0, 176])
    budget = jnp.asarray([2, 1], jnp.int32)
    logits = {}
    for kernel in ("triton", "mosaic"):
        raw.attention.moba_backend = kernel
        cfg = from_config_dict(raw)
        model = Transformer(cfg.model, cfg.attention, cfg.k_max)
        params = model.init(jax.random.key(0), ids, seg, pos, budget)["params"]
        apply = lambda p: model.apply({"params": p}, ids, seg, pos, budget)
        # The Hopper kernel's matrix products are wgmma instructions; the Triton kernel has none.
        assert ("wgmma" in str(jax.make_jaxpr(apply)(params))) == (kernel == "mosaic")
        logits[kernel] = np.asarray(jax.jit(apply)(params), np.float32)
    err = np.linalg.norm(logits["mosaic"] - logits["triton"]) / np.linalg.norm(logits["triton"])
    assert err < 2e-2, err




def _live_eqns(jaxpr, used=None) -> list:
    """The equations of a jaxpr whose outputs it uses (used: which of its outputs count, default
    all), those inside sub-jaxprs (scan, remat, custom_vjp) included, a pallas_call's kernel not.
    An unused pallas_call stays in a jaxpr (Pallas' DCE rule keeps every one) but not in the
    program: its custom call has no side effects, so XLA removes it."""
    live = {v for v, u in zip(jaxpr.outvars, used or [True] * len(jaxpr.outvars))
            if u and isinstance(v, jax.extend.core.Var)}
    eqns = []
    for eqn in reversed(jaxpr.eqns):
        outs = [v in live for v in eqn.outvars]
        if not any(outs):
            continue
        live.update(v for v in eqn.invars if isinstance(v, jax.extend.core.Var))
        eqns.append(eqn)
        if eqn.primitive.name != "pallas_call":
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                eqns += _live_eqns(sub, outs if len(sub.outvars) == len(outs) else None)
    return eqns


@pytest.mark.parametrize("scan_layers", [True, False])
def test_remat_keeps_what_it_is_told(scan_layers):
    """A rematerialised layer keeps what model.remat_keep names for the backward pass: with
    "attention" MoBA's gate and forward kernel run once per layer in a step, not twice; with
    "mlp" too, the SwiGLU's gate and up projections are not computed again (two products fewer
    per layer). The gradients are those of the scanned model without remat in every case, the
    layers scanned (counted once, in the scan's body) or unrolled (counted per layer)."""
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, 2, 64, [0, 24])
    targets, mask = jnp.roll(tokens, -1, axis=1), jnp.ones_like(tokens, jnp.float32)
    budget = jnp.asarray([2, 1], jnp.int32)
    def loss(p, model):
        logits = model.apply({"params": p}, tokens, seg, pos, budget)
        s, n = token_losses(logits, targets, mask)
        return s / n

    grads, kernels, products = {}, {}, {}
    for remat, keep in ((False, ()), (True, ()), (True, ("attention",)),
                        (True, ("attention", "mlp"))):
        cfg = tiny_config("moba", remat=remat, remat_keep=keep, scan_layers=scan_layers)
        model = Transformer(cfg.model, cfg.attention, cfg.k_max)
        if not remat:
            params = nn.meta.unbox(
                model.init(jax.random.key(0), tokens, seg, pos, budget)["params"])
        grad = jax.grad(functools.partial(loss, model=model))
        eqns = _live_eqns(jax.make_jaxpr(grad)(params).jaxpr)
        names = [str(e.params.get("name", e.params.get("name_and_src_info"))) for e in eqns
                 if e.primitive.name == "pallas_call"]
        kernels[remat, keep] = tuple(sum(n.startswith(kernel) for n in names)
                                     for kernel in ("moba_gate_topk", "moba_fwd"))
        products[remat, keep] = sum(e.primitive.name == "dot_general" for e in eqns)
        grads[remat, keep] = jax.jit(grad)(params)
    per = 1 if scan_layers else cfg.model.num_layers
    assert kernels == {(False, ()): (per, per), (True, ()): (2 * per, 2 * per),
                       (True, ("attention",)): (per, per),
                       (True, ("attention", "mlp")): (per, per)}
    assert products[True, ("attention", "mlp")] == products[True, ("attention",)] - 2 * per
    if not scan_layers:  # the same parameters, scanned
        cfg = tiny_config("moba", remat=False, remat_keep=())
        scanned = Transformer(cfg.model, cfg.attention, cfg.k_max)
        grads["scanned"] = jax.jit(jax.grad(functools.partial(loss, model=scanned)))(params)
    for key in list(grads)[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     grads[key], grads[False, ()])


def test_unrolled_layers_lower_to_one_function():
    """Unrolled (model.scan_layers False), the layers lower to one function for the forward and
    one for the backward, each called once per layer, so that their kernels are lowered (and,
    on the GPU, compiled) once rather than per layer."""
    rng = np.random.default_rng()
    tokens, seg, pos = packed_inputs(rng, 2, 64, [0, 24])
    budget = jnp.asarray([2, 1], jnp.int32)
    cfg = tiny_config("moba", remat=True, remat_keep=("attention",), scan_layers=False)
    model = Transformer(cfg.model, cfg.attention, cfg.k_max)
    params = nn.meta.unbox(model.init(jax.random.key(0), tokens, seg, pos, budget)["params"])
    text = jax.jit(jax.grad(lambda p: model.apply({"params": p}, tokens, seg, pos, budget).sum())
                   ).lower(params).as_text()
    calls = collections.Counter(re.findall(r"call @(run\w*)\(", text))
    assert len(calls) == 2 and set(calls.values()) == {cfg.model.num_layers}, calls


def test_layer_budget_scale_reaches_each_layer(monkeypatch):
    """attention.layer_budget_scale: each layer runs the row budgets times its own scale
    (rounded half to even, at least 1: 1 x 0.5 rounds to 0, run as 1), scanned or unrolled,
    with the same logits."""
    from sparsebalance_jax.model import transformer

    seen = []
    attention_op = transformer.attention_op

    def recording(q, k, v, seg, budget, **kwargs):
        jax.debug.callback(lambda b: seen.append(np.asarray(b).tolist()), budget, ordered=True)
        return attention_op(q, k, v, seg, budget, **kwargs)

    monkeypatch.setattr(transformer, "attention_op", recording)
    tokens, seg, pos = packed_inputs(np.random.default_rng(), 3, 64, [0, 32])
    budget = jnp.asarray([4, 3, 1], jnp.int32)
    logits = {}
    for scan in (True, False):
        cfg = tiny_config("moba", scan_layers=scan)
        cfg = dataclasses.replace(cfg, attention=dataclasses.replace(
            cfg.attention, layer_budget_scale=(0.5, 1.0)))
        model = Transformer(cfg.model, cfg.attention, 4)
        if scan:
            params = nn.meta.unbox(model.init(jax.random.key(0), tokens, seg, pos,
                                              budget)["params"])
        seen.clear()
        logits[scan] = np.asarray(model.apply({"params": params}, tokens, seg, pos, budget))
        jax.effects_barrier()
        assert seen == [[2, 2, 1], [4, 3, 1]], (scan, seen)  # 3 x 0.5 = 1.5 rounds to 2
    np.testing.assert_allclose(logits[True], logits[False], rtol=1e-5, atol=1e-6)
    # A scale per layer, or none: built past the config's validation, another count is an
    # error either way (unrolled, an index past the end would have read the last scale).
    for scales in ((0.5,), (0.5, 1.0, 0.25)):
        for scan in (True, False):
            cfg = tiny_config("moba", scan_layers=scan)
            model = Transformer(cfg.model, dataclasses.replace(
                cfg.attention, layer_budget_scale=scales), 4)
            with pytest.raises(ValueError, match=f"{len(scales)} entries for "
                                                 "model.num_layers=2"):
                model.apply({"params": params}, tokens, seg, pos, budget)
