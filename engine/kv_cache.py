"""Sizing and allocating the paged KV cache tensors."""
from __future__ import annotations

import logging

import torch

from engine.host_limits import available_host_memory
from engine.models.llama import ModelArch

logger = logging.getLogger(__name__)


def bytes_per_block(arch: ModelArch, block_size: int, dtype: torch.dtype) -> int:
    """K and V, every layer, one block."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_layers * block_size * arch.num_kv_heads * arch.head_dim * elem


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    return available_host_memory()


def allocate_kv_caches(arch: ModelArch, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (arch.num_kv_heads, num_blocks, block_size, arch.head_dim)
    # Zeroed so masked-out slots never hold NaN bit patterns (0 * NaN would poison attention).
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(arch.num_layers)]
