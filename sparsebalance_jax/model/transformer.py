"""The decoder: embedding, a stack of pre-norm layers (scanned, or unrolled over the same
stacked parameters: model.scan_layers), final norm, LM head.

Parameters are created in `model.param_dtype` (float32 master weights by default) and cast to
`model.compute_dtype` (bfloat16) for the matmuls; norms, softmax statistics and logits stay in
float32. Every parameter and the main activations carry logical axis names (see
`sparsebalance_jax.sharding.mesh.LOGICAL_RULES`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sparsebalance_jax.config import AttentionConfig, ModelConfig
from sparsebalance_jax.model.attention import attention_op, KEPT_RESIDUALS

_INIT_STD = 0.02


def _init(axes):
    return nn.with_logical_partitioning(nn.initializers.normal(_INIT_STD), axes)


def _dtype(name: str):
    return jnp.dtype(name)


class RMSNorm(nn.Module):
    eps: float
    param_dtype: str
    compute_dtype: str

    @nn.compact
    def __call__(self, x_BTE):
        scale_E = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                             (x_BTE.shape[-1],), _dtype(self.param_dtype))
        x32 = x_BTE.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale_E.astype(jnp.float32)).astype(_dtype(self.compute_dtype))


def apply_rope(x_BTHD, positions_BT, theta: float):
    """Rotary embedding, rotate-half convention, angles computed in float32."""
    d = x_BTHD.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles_BTF = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    cos, sin = jnp.cos(angles_BTF)[:, :, None], jnp.sin(angles_BTF)[:, :, None]
    x1, x2 = jnp.split(x_BTHD.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTHD.dtype)


class Embed(nn.Module):
    """Token embedding: the "embedding" table [vocab, embed], looked up whole.

    Under fsdp the table's embed axis is gathered for the lookup (its gradient reduce-scattered
    back), as every sharded weight is before use. Looked up sharded, its gradient would need
    the activations' gradient laid out over embed, which XLA's partitioner does by replicating
    it ("Involuntary full rematerialization" at data 1 x fsdp 4 x tensor 2): a [B, T, E]
    tensor where the table is [vocab, E] (the byte vocabulary: 384 rows)."""

    model: ModelConfig

    @nn.compact
    def __call__(self, inputs_BT):
        m = self.model
        table_VE = self.param("embedding", _init(("vocab", "embed")), (m.vocab_size, m.d_model),
                              _dtype(m.param_dtype))
        table_VE = nn.with_logical_constraint(table_VE.astype(_dtype(m.compute_dtype)),
                                              ("vocab", None))
        return jnp.take(table_VE, inputs_BT, axis=0)


class Linear(nn.Module):
    """Contracts the last `in_dims` axes of x with a kernel whose axes carry logical names.

    (flax's DenseGeneral initialises multi-axis kernels flat and reshapes them, which breaks
    their logical sharding annotation; this keeps the kernel in its true shape.)
    """

    out_shape: tuple[int, ...]
    axes: tuple[str, ...]
    in_dims: int = 1
    bias_axes: tuple[str, ...] | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x):
        shape = x.shape[x.ndim - self.in_dims:] + tuple(self.out_shape)
        kernel = self.param("kernel", _init(self.axes), shape, _dtype(self.param_dtype))
        y = jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype), axes=self.in_dims)
        if self.bias_axes is not None:
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, self.bias_axes), tuple(self.out_shape),
                _dtype(self.param_dtype))
            y = y + bias.astype(self.dtype)
        return y


class Attention(nn.Module):
    model: ModelConfig
    attention: AttentionConfig
    k_max: int

    def setup(self):
        m = self.model
        dt = dict(dtype=m.compute_dtype, param_dtype=m.param_dtype)
        # Qwen2-style projections: biases on q, k, v, none on the output.
        self.q = Linear((m.num_heads, m.head_dim), ("embed", "heads", "head_dim"),
                        bias_axes=("heads", "head_dim"), **dt)
        kv = dict(axes=("embed", "kv_heads", "head_dim"), bias_axes=("kv_heads", "head_dim"), **dt)
        self.k = Linear((m.num_kv_heads, m.head_dim), **kv)
        self.v = Linear((m.num_kv_heads, m.head_dim), **kv)
        self.o = Linear((m.d_model,), ("heads", "head_dim", "embed"), in_dims=2, **dt)

    def qkv(self, x_BTE, positions_BT):
        """Projected, rotated q [B,T,Hq,D] and k [B,T,Hkv,D], and v [B,T,Hkv,D]."""
        q_BTHD, k_BTKD = self.gate_qk(x_BTE, positions_BT)
        q_BTHD = nn.with_logical_constraint(q_BTHD, ("act_batch", "act_seq", "act_heads", None))
        k_BTKD = nn.with_logical_constraint(k_BTKD, ("act_batch", "act_seq", "act_kv_heads", None))
        v_BTKD = nn.with_logical_constraint(self.v(x_BTE),
                                            ("act_batch", "act_seq", "act_kv_heads", None))
        return q_BTHD, k_BTKD, v_BTKD

    def gate_qk(self, x_BTE, positions_BT, query_stride: int = 1):
        """What the MoBA gate scores: rotated q of tokens 0, query_stride, 2 * query_stride, ...
        [B, S, Hq, D] (S = ceil(T / query_stride)) and k of every token [B, T, Hkv, D]."""
        theta = self.model.rope_theta
        x_BSE, positions_BS = x_BTE[:, ::query_stride], positions_BT[:, ::query_stride]
        return (apply_rope(self.q(x_BSE), positions_BS, theta),
                apply_rope(self.k(x_BTE), positions_BT, theta))

    def __call__(self, x_BTE, segment_ids_BT, positions_BT, budget_B):
        q_BTHD, k_BTKD, v_BTKD = self.qkv(x_BTE, positions_BT)
        m = self.model
        out_BTHD = attention_op(q_BTHD, k_BTKD, v_BTKD, segment_ids_BT, budget_B,
                                cfg=self.attention, k_max=self.k_max,
                                keep_residuals=m.remat and "attention" in m.remat_keep)
        return self.o(out_BTHD)


# The name of the SwiGLU's gate and up projections, which model.remat_keep "mlp" keeps.
MLP_INPUTS = "mlp_inputs"


def remat_policy(keep: tuple[str, ...]):
    """The policy of a layer rematerialised keeping `keep` (model.remat_keep): the named values
    of each entry saved for the backward pass, everything else recomputed; None keeps nothing."""
    names = {"attention": KEPT_RESIDUALS, "mlp": MLP_INPUTS}
    return jax.checkpoint_policies.save_only_these_names(*map(names.get, keep)) if keep else None


class SwiGLU(nn.Module):
    model: ModelConfig

    @nn.compact
    def __call__(self, x_BTE):
        m = self.model
        dt = dict(dtype=m.compute_dtype, param_dtype=m.param_dtype)
        # Named for a rematerialised layer's policy (model.remat_keep "mlp"); no effect elsewhere.
        gate_BTF = checkpoint_name(Linear((m.mlp_dim,), ("embed", "mlp"), name="gate", **dt)(x_BTE),
                                   MLP_INPUTS)
        up_BTF = checkpoint_name(Linear((m.mlp_dim,), ("embed", "mlp"), name="up", **dt)(x_BTE),
                                 MLP_INPUTS)
        h_BTF = nn.with_logical_constraint(nn.silu(gate_BTF) * up_BTF,
                                           ("act_batch", "act_seq", "act_mlp"))
        return Linear((m.d_model,), ("mlp", "embed"), name="down", **dt)(h_BTF)


class DecoderLayer(nn.Module):
    model: ModelConfig
    attention: AttentionConfig
    k_max: int

    @nn.compact
    def __call__(self, x_BTE, segment_ids_BT, positions_BT, budget_B, budget_scale):
        m = self.model
        norm = dict(eps=m.rms_eps, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype)
        # Per-layer budget: the row's budget times this layer's scale, at least the own block.
        # The bucket k_max is chosen to hold the largest scaled budget (config.max_layer_budget).
        layer_budget_B = jnp.maximum(jnp.round(budget_B * budget_scale), 1).astype(jnp.int32)
        h_BTE = RMSNorm(name="attn_norm", **norm)(x_BTE)
        x_BTE = x_BTE + Attention(m, self.attention, self.k_max, name="attn")(
            h_BTE, segment_ids_BT, positions_BT, layer_budget_B)
        h_BTE = RMSNorm(name="mlp_norm", **norm)(x_BTE)
        x_BTE = x_BTE + SwiGLU(m, name="mlp")(h_BTE)
        x_BTE = nn.with_logical_constraint(x_BTE, ("act_batch", "act_seq", "act_embed"))
        return x_BTE, None


def unrolled_layer(model: ModelConfig, attention: AttentionConfig, k_max: int):
    """One decoder layer as a function of its parameters (one layer's slice of the stacked
    "layers" tree) and its inputs, for the stack unrolled (model.scan_layers False): rematerialised
    as the scanned layer is (model.remat, remat_keep), and jitted so that the layers lower to
    one function (their kernels compiled once). Unrolled, each layer's kept values are buffers of
    their own; the scan copies them into its stacked buffers (BENCHMARKS.md)."""
    def run(params, x_BTE, segment_ids_BT, positions_BT, budget_B, budget_scale):
        layer = DecoderLayer(model, attention, k_max, parent=None)
        return layer.apply({"params": params}, x_BTE, segment_ids_BT, positions_BT, budget_B,
                           budget_scale)[0]

    if model.remat:
        # prevent_cse stays on: outside a scan XLA could otherwise merge the recomputation
        # with the forward pass and keep everything the policy drops.
        run = jax.checkpoint(run, policy=remat_policy(model.remat_keep))
    return jax.jit(run)


class Transformer(nn.Module):
    """Decoder LM over packed rows. `k_max` is the static budget bound (the compiled bucket)."""

    model: ModelConfig
    attention: AttentionConfig
    k_max: int

    @nn.compact
    def __call__(self, inputs_BT, segment_ids_BT, positions_BT, budget_B):
        m = self.model
        x_BTE = Embed(m, name="embed")(inputs_BT)
        x_BTE = nn.with_logical_constraint(x_BTE, ("act_batch", "act_seq", "act_embed"))
        scales = self.attention.layer_budget_scale
        if scales and len(scales) != m.num_layers:
            # The config's validation says so too; a config built past it would otherwise run
            # unrolled with an index past the end clamped to the last scale.
            raise ValueError(f"attention.layer_budget_scale has {len(scales)} entries for "
                             f"model.num_layers={m.num_layers}")
        scales_L = (jnp.asarray(scales, jnp.float32) if scales
                    else jnp.ones((m.num_layers,), jnp.float32))
        if m.scan_layers or self.is_initializing():
            layer = DecoderLayer
            if m.remat:
                layer = nn.remat(layer, prevent_cse=False, policy=remat_policy(m.remat_keep))
            # No broadcast variables, so flax's extra constancy-check trace is not needed; it
            # would also reject effectful kernels inside the body (Pallas interpret mode on CPU).
            stack = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0),
                            length=m.num_layers, metadata_params={nn.PARTITION_NAME: "layers"},
                            check_constancy_invariants=False)
            x_BTE, _ = stack(m, self.attention, self.k_max, name="layers")(
                x_BTE, segment_ids_BT, positions_BT, budget_B, scales_L)
        else:
            run = unrolled_layer(m, self.attention, self.k_max)
            stacked = nn.meta.unbox(self.variables["params"]["layers"])
            # Each weight split into its layers in one op, whose gradient is one concatenation.
            # Layer i sliced out on its own instead makes the stacked gradient a chain of one
            # padded add per layer over the whole stack (BENCHMARKS.md, "The stacked weights'
            # gradient").
            leaves, tree = jax.tree.flatten(stacked)
            parts = [jax.lax.split(x, [1] * m.num_layers) for x in leaves]
            for i in range(m.num_layers):
                layer_params = jax.tree.unflatten(tree, [part[i][0] for part in parts])
                x_BTE = run(layer_params, x_BTE, segment_ids_BT, positions_BT, budget_B,
                            scales_L[i])
        x_BTE = RMSNorm(m.rms_eps, m.param_dtype, m.compute_dtype, name="final_norm")(x_BTE)
        logits_BTV = Linear((m.vocab_size,), ("embed", "vocab"), dtype="float32",
                            param_dtype=m.param_dtype, name="lm_head")(x_BTE)
        return nn.with_logical_constraint(logits_BTV, ("act_batch", "act_seq", "act_vocab"))


def first_layer_qk(model: Transformer, params, inputs_BT, positions_BT, query_stride: int = 1):
    """The first layer's gate inputs for `params`: what the MoBA gate scores there - q of every
    query_stride-th token [B, S, Hq, D] and k of every token [B, T, Hkv, D] (Attention.gate_qk)."""
    m = model.model
    layer0 = jax.tree.map(lambda p: p[0], params["layers"])
    x_BTE = params["embed"]["embedding"][inputs_BT].astype(m.compute_dtype)
    h_BTE = RMSNorm(m.rms_eps, m.param_dtype, m.compute_dtype).apply(
        {"params": layer0["attn_norm"]}, x_BTE)
    return Attention(m, model.attention, model.k_max).apply(
        {"params": layer0["attn"]}, h_BTE, positions_BT, query_stride, method=Attention.gate_qk)


def token_losses(logits_BTV, targets_BT, loss_mask_BT):
    """Masked next-token cross entropy: (sum of losses, number of trained tokens)."""
    logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    gold_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
    mask_BT = loss_mask_BT.astype(jnp.float32)
    return jnp.sum((logz_BT - gold_BT) * mask_BT), jnp.sum(mask_BT)
