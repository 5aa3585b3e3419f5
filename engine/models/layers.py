"""Building blocks shared by the model families: RMSNorm with fused residual add, RoPE."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.native: Any = None  # the native CPU kernels' module, when the engine turned them on

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual).

        The add and the norm happen in one call so the sum is formed once and reused as the next
        residual; the reduction runs in float32 like the reference implementation. With the
        native CPU kernels set (`self.native`), [rows, hidden] inputs take one fused pass.
        """
        native = self.native
        if native is not None and x.dim() == 2 and x.is_contiguous() and x.device.type == "cpu" \
                and (residual is None or residual.is_contiguous()):
            out, total = native.fused_add_rms_norm(x, residual, self.weight, self.eps)
            return out if residual is None else (out, total)
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * xf.to(x.dtype)
        return out if residual is None else (out, residual)


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, short ones kept."""
    factor = params["factor"]
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old_len = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE over a precomputed cos/sin table indexed by absolute position."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None):
        super().__init__()
        # the tables are computed on the CPU and move with the module: under the meta device's
        # context (the model's construction) arange's meta path imports torch._dynamo (~1.5 s)
        cpu = torch.device("cpu")
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=cpu) / head_dim))
        scaling = scaling or {}
        rope_type = scaling.get("rope_type", "default")
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif rope_type == "linear":
            inv_freq = inv_freq / scaling["factor"]
        elif rope_type != "default":
            raise ValueError(f"unsupported rope_type {rope_type!r}")
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float64, device=cpu), inv_freq)
        # [max_position, head_dim // 2] each; kept in float32, cast per step to the model dtype
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step tables, built once per forward and shared by every layer:
        cos as [cos, cos] and sin as [-sin, sin], each [num_tokens, 1, head_dim]."""
        cos, sin = self.cos[positions], self.sin[positions]
        return torch.cat((cos, cos), -1).unsqueeze(1).to(dtype), torch.cat((-sin, sin), -1).unsqueeze(1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, heads, head_dim]. Rotate-half RoPE: x*cos + [x2, x1]*[-sin, sin]."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * sin
