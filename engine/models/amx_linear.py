"""Linear layers for batches on Intel AMX, on the GGUF's own codes (engine/native/csrc/amx_linear.cpp).

A decode step of 16-64 rows is bound by neither the bytes of the weights nor the arithmetic
alone: oneDNN's bf16 matmul reads the inflated bf16 weights (three times the codes' bytes), the
codes' own kernel spends its time turning each code into a bf16 per row. This one turns each
group of codes into a bf16 tile once per call, next to the matrix unit, which then multiplies it
against all the rows; the vector units make the next group's tile while the matrix unit runs.

The weights are exactly the dense path's (the codes de-quantized in float32, rounded to bf16), so
this is the dense bf16 method on fewer bytes, not another approximation.
"""
from __future__ import annotations

from types import ModuleType

import torch

from engine.models.gguf_codes import GroupCodes
from engine.models.linear import Linear, LinearMethod


class AmxCodesMethod(LinearMethod):
    """One layer's codes in matrix-unit tiles (GroupCodes.amx_tiles); bfloat16 inputs only."""

    name = "amx-bf16"

    def __init__(self, codes: GroupCodes, native: ModuleType):
        self.native, self.format = native, codes.format
        self.codes, self.scales, self.mins = codes.amx_tiles()
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.native.amx_linear(x.contiguous(), self.codes, self.scales, self.mins, self.format, False)

    def gate_up_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        return self.native.amx_linear_silu_mul(x.contiguous(), self.codes, self.scales, self.mins, self.format)

    def float32_logits(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        return self.native.amx_linear(x.contiguous(), self.codes, self.scales, self.mins, self.format, True)

    def weight_bytes_read(self, layer: Linear, rows: int, dtype: torch.dtype) -> int:
        return self.nbytes

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "scales": self.scales, "mins": self.mins}


def amx_ready(native: ModuleType, codes: GroupCodes) -> bool:
    return native.amx_linear_available() and codes.amx_tiles_ready
