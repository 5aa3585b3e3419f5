"""Linear layers for batches as int8 activations x int8 weights, through the native VNNI kernel
(engine/native/csrc/int8_linear.cpp).

A step of many rows is bound by arithmetic, and AVX512-VNNI's VPDPBUSD does twice the
multiply-adds of bfloat16's VDPBF16PS per instruction. The weights are quantized once per output
channel (symmetric, 127 levels); the activations per row and group of 64 inputs, in the kernel,
for each call. Of the two, the activations' grouping is what keeps the error small: one scale per
row costs this model about 3 % of perplexity, groups of 32 about 0.4 % and groups of 64 0.1-0.3 %
more than 32 (the README's perplexity table has the figures; the kernel's comment says why 64).
"""
from __future__ import annotations

from types import ModuleType

import torch

from engine.models.linear import Linear, LinearMethod

VECTOR = 16  # outputs per weight vector of the kernel
QUAD = 4  # inputs per 32-bit lane
GROUP = 64  # inputs per activation scale


def int8_shape_ready(output_size: int, input_size: int) -> bool:
    return output_size % VECTOR == 0 and input_size % GROUP == 0


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [out, in] -> (uint8 [out/16, in/4, 16, 4]: q + 128, float32 [out]: scales), with
    w ~ scale * q, q = round(w / scale) in -127..127 and scale = max |w| of the output / 127."""
    out, inp = weight.shape
    assert int8_shape_ready(out, inp), f"int8 weights need out % 16 == 0 and in % 64 == 0, not {weight.shape}"
    weight = weight.float()
    scales = weight.abs().amax(dim=1) / 127
    q = torch.round(weight / torch.where(scales > 0, scales, 1.0)[:, None]).clamp(-127, 127)
    codes = (q.to(torch.int16) + 128).to(torch.uint8)
    return codes.view(out // VECTOR, VECTOR, inp // QUAD, QUAD).transpose(1, 2).contiguous(), scales.contiguous()


def unpack_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The weights pack_int8 keeps, float32 [out, in] (for references and error reports)."""
    blocks, quads, vector, quad = codes.shape
    q = codes.transpose(1, 2).reshape(blocks * vector, quads * quad).to(torch.int16) - 128
    return q.float() * scales[:, None]


class Int8LinearMethod(LinearMethod):
    """One layer's weights as int8 per output channel, applied with int8 activations."""

    name = "int8-g64"

    def __init__(self, weight: torch.Tensor, native: ModuleType):
        self.native = native
        self.codes, self.scales = pack_int8(weight)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.native.int8_linear(x, self.codes, self.scales, False)

    def float32_logits(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        return self.native.int8_linear(x, self.codes, self.scales, True)  # the kernel's sums are float32

    def gate_up_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """None where a half of [gate | up] is not whole weight vectors of the kernel."""
        if self.codes.shape[0] % 2:
            return None
        return self.native.int8_linear_silu_mul(x, self.codes, self.scales)

    def weight_bytes_read(self, layer: Linear, rows: int, dtype: torch.dtype) -> int:
        return self.codes.numel() + self.scales.numel() * self.scales.element_size()

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "scales": self.scales}


def use_int8_weights(model: torch.nn.Module, native: ModuleType, rest: LinearMethod) -> list[str]:
    """--quantization int8 on dense weights (lossy, opt-in): every linear layer without a bias whose
    shape the kernel takes gets an Int8LinearMethod for all its rows; the others `rest` (their
    weights reworked by it once). Returns the names of those others. The model must have been
    loaded with plain LinearMethods, which keep each dense weight as it came."""
    others = []
    for name, layer in model.named_modules():
        if not isinstance(layer, Linear):
            continue
        if layer.has_bias or not int8_shape_ready(layer.output_size, layer.input_size):
            layer.method = rest
            layer.process_weights_after_loading()
            others.append(name)
            continue
        if layer.keep_dense_weight:
            layer.dense = layer.weight.detach()  # row lookups (a tied LM head: the embedding itself)
        layer.method = Int8LinearMethod(layer.weight.detach().float(), native)
    return others
