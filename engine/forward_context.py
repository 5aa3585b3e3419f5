"""Per-step attention metadata, built once by the model runner and read by every layer.

The flat batch holds the decode tokens first (one per sequence), then the prefill chunks.
Layers reach the metadata through `get_forward_context()` inside a `forward_context(...)`
block, never through a bare mutable global that outlives the step.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch


@dataclass
class PrefillChunk:
    """One sequence's prefill chunk: rows [query_start, query_start + query_len) of the batch."""

    query_start: int
    query_len: int
    context_len: int  # tokens of this sequence in the cache after this step (cached + chunk)
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] int64, on the device
    # [query_len, context_len] bool, True = may attend; None when the chunk is the whole
    # sequence (no cached prefix), where plain causal attention applies.
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot (block * block_size + offset)
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int64
    # [kv_heads * num_decodes, 1, max_blocks * block_size] bool, True past a sequence's length
    decode_mask: torch.Tensor | None
    prefills: list[PrefillChunk]


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K, V [kv_heads, blocks, block_size, head_dim]


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("forward_context", default=None)


@contextlib.contextmanager
def forward_context(ctx: ForwardContext):
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def get_forward_context() -> ForwardContext:
    ctx = _current.get()
    assert ctx is not None, "model forward called outside forward_context(...)"
    return ctx
