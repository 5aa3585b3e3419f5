"""CPU fast path for bfloat16 linears: weights pre-packed once into oneDNN's blocked layout.

On a CPU with AVX512-BF16/AMX, oneDNN's packed bf16 GEMM reads the weights about twice as fast
as torch's default path for the small-M matmuls of decode (1 to 64 rows). The packed weight is a
copy, made once at load time; everything else (CUDA, float32) keeps plain nn.Linear.
"""
from __future__ import annotations

import torch
from torch import nn


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_hint: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_linears(module: nn.Module, batch_hint: int) -> int:
    """Replace every nn.Linear under `module` by a PackedLinear; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, batch_hint))
            count += 1
        else:
            count += pack_linears(child, batch_hint)
    return count
