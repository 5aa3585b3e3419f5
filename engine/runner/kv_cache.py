"""Sizing and allocating the paged KV cache tensors (their layout is the attention backend's)."""
from __future__ import annotations

import torch

from engine.attention.kv_int8 import row_width
from engine.malloc import zeros_on_huge_pages
from engine.models.config import ModelArch


def bytes_per_block(arch: ModelArch, block_size: int, dtype: torch.dtype) -> int:
    """K and V, every layer, one block, in the cache's dtype (torch.int8: kv_int8.py's rows, each
    with its scale)."""
    row = row_width(arch.head_dim, dtype) * dtype.itemsize
    return 2 * arch.num_layers * block_size * arch.num_kv_heads * row


def allocate_kv_caches(num_layers: int, shape: tuple[int, ...], dtype: torch.dtype,
                       device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Zeroed so masked-out slots never hold NaN bit patterns (0 * NaN would poison attention);
    # on the CPU on huge pages (engine/malloc.py: a decode step reads blocks all over the cache).
    def zeros() -> torch.Tensor:
        if device.type == "cpu":
            return zeros_on_huge_pages(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=device)

    return [(zeros(), zeros()) for _ in range(num_layers)]
