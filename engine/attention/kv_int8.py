"""The int8 KV cache's rows (`--kv-cache-dtype int8`) in torch ops; engine/native/csrc/kv_int8.h
is the same codec in the native kernels, with the same float32 operations, so both write and
read identical bytes.

One row per (token, kv head): head_dim int8 codes, then the row's float32 scale in the next 4
bytes, so a layer's cache is int8 [kv_heads, blocks, block_size, head_dim + 4] and a slot
addresses a row as in a bf16 cache:

    scale = max |x| / 127     q = round_half_even(x / scale)  (q = 0 where scale = 0)
    x' = dtype(q * scale)

Half the bytes of a bf16 row (68 instead of 128 at head_dim 64), which is what a decode step
reads per key and layer; the rounding error is at most scale / 2 per element (0.4 % of the
row's largest magnitude).
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4  # the float32 scale after each row's codes


def row_width(head_dim: int, kv_cache_dtype: torch.dtype | None) -> int:
    """Elements of one cache row (None: the model's dtype)."""
    return head_dim + SCALE_BYTES if kv_cache_dtype == torch.int8 else head_dim


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] float -> int8 [..., head_dim + 4]."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = torch.round(xf / divisor).clamp_(-127, 127).to(torch.int8)
    return torch.cat([codes, scale.view(torch.int8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., head_dim + 4] -> [..., head_dim] in `dtype`."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :head_dim].float() * scale).to(dtype)


def as_model_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows gathered from a cache, in the model's `dtype`: an int8 cache's de-quantized, any
    other's as they are."""
    return dequantize_rows(rows, dtype) if rows.dtype == torch.int8 else rows


def describe_kv_dtype(kv_cache_dtype: torch.dtype) -> str:
    """For the start-up log."""
    if kv_cache_dtype == torch.int8:
        return "int8 rows with a float32 scale each"
    return str(kv_cache_dtype).removeprefix("torch.")
