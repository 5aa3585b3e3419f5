"""Batches on the GGUF's Q4_1 codes against int8 activations (engine/native/csrc/q4_int8_linear.cpp).

The rows above a layer's crossover otherwise take int8 weights made from the codes (int8-g64: a
second rounding of the weights) or the dense method. On CPUs without VPDPBUSD (the AVX2 tier) the
int8 dot products are bound by the multiplying instructions, and the 4-bit codes need about half
as many per product as int8 weights (their pair sums add up in int16 over a group), so there this
method can be the faster one, on the exact weights; measure_batch_methods keeps it where it wins.
"""
from __future__ import annotations

from types import ModuleType

import torch

from engine.models.gguf_codes import GroupCodes
from engine.models.linear import Linear, LinearMethod


class Q4Int8BatchMethod(LinearMethod):
    """One Q4_1 layer's codes in q4_int8_linear.cpp's tiles (GroupCodes.int8_tiles), for batches."""

    name = "q4_1-int8"

    def __init__(self, codes: GroupCodes, native: ModuleType):
        self.native = native
        self.codes, self.scales, self.mins = codes.int8_tiles()
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.native.q4_int8_linear(x, self.codes, self.scales, self.mins, False)

    def float32_logits(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        return self.native.q4_int8_linear(x, self.codes, self.scales, self.mins, True)  # float32 sums

    def weight_bytes_read(self, layer: Linear, rows: int, dtype: torch.dtype) -> int:
        return self.nbytes

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "scales": self.scales, "mins": self.mins}


def q4_int8_batch_ready(native: ModuleType, codes: GroupCodes) -> bool:
    return native.q4_int8_linear_available() and codes.int8_tiles_ready
