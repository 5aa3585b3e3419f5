"""Attention backends behind one interface (`base.py`), and the call the models make."""
from __future__ import annotations

from types import ModuleType

import torch

from engine.attention.base import AttentionBackend, StepInputs
from engine.attention.forward_context import get_forward_context

__all__ = ["AttentionBackend", "StepInputs", "create_backend", "paged_attention", "rope_and_write_kv"]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int, scale: float,
                    kv_written: bool = False) -> torch.Tensor:
    """The models' attention call: this step's backend, metadata and the layer's KV cache.

    q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim]; `kv_written`: k and
    v are in the cache already (from `rope_and_write_kv`)."""
    ctx = get_forward_context()
    return ctx.backend.forward(q, k, v, ctx.kv_caches[layer_idx], ctx.metadata, scale, kv_written)


def rope_and_write_kv(qk: torch.Tensor, v: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], layer_idx: int,
                      num_heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The backend's fused RoPE + KV-cache write for this layer, or None where it has none."""
    ctx = get_forward_context()
    return ctx.backend.rope_and_write_kv(qk, v, rope, ctx.kv_caches[layer_idx], ctx.metadata, num_heads)


def create_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                   native: ModuleType | None = None, kv_cache_dtype: torch.dtype | None = None) -> AttentionBackend:
    """`native`: the native CPU kernels' module (engine/native), for one-query batches and the
    fused RoPE + KV write; None: torch ops only. `kv_cache_dtype`: the cache's element type, the
    model's dtype (None: the same) or torch.int8 (`kv_int8.py`, the torch backend only)."""
    if name == "torch-paged":
        from engine.attention.torch_paged import TorchPagedBackend

        return TorchPagedBackend(num_heads, num_kv_heads, head_dim, block_size, native, kv_cache_dtype)
    if kv_cache_dtype == torch.int8:
        raise ValueError(f"--kv-cache-dtype int8: the {name} attention backend reads caches in the model's dtype only")
    if name == "triton-paged":
        from engine.attention.triton_paged import TritonPagedBackend

        return TritonPagedBackend(num_heads, num_kv_heads, head_dim, block_size)
    raise ValueError(f"unknown attention backend {name!r}")
