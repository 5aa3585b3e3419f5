"""Attention backends behind one interface (`base.py`), and the call the models make."""
from __future__ import annotations

import torch

from engine.attention.base import AttentionBackend, StepInputs
from engine.attention.forward_context import get_forward_context

__all__ = ["AttentionBackend", "StepInputs", "create_backend", "paged_attention"]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int, scale: float) -> torch.Tensor:
    """The models' attention call: this step's backend, metadata and the layer's KV cache.

    q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim]."""
    ctx = get_forward_context()
    return ctx.backend.forward(q, k, v, ctx.kv_caches[layer_idx], ctx.metadata, scale)


def create_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                   native_decode: bool = False) -> AttentionBackend:
    """`native_decode`: attend one-query batches with the native CPU kernel if it builds."""
    if name == "torch-paged":
        from engine.attention.torch_paged import TorchPagedBackend

        return TorchPagedBackend(num_heads, num_kv_heads, head_dim, block_size, native_decode)
    raise ValueError(f"unknown attention backend {name!r}")
