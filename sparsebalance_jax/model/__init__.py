"""Flax decoder for packed long-context sequences (RMSNorm, RoPE, SwiGLU, GQA attention)."""

from sparsebalance_jax.model.attention import attention_op
from sparsebalance_jax.model.transformer import Transformer, first_layer_qk, token_losses

__all__ = ["Transformer", "attention_op", "first_layer_qk", "token_losses"]
