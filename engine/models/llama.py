"""Llama-family decoder (SmolLM2, Llama 3) and Qwen3 (= Llama + per-head QK RMSNorm).

Forward takes the flat batch `(input_ids [num_tokens], positions [num_tokens])` and returns
hidden states [num_tokens, hidden]; the runner picks each sequence's last row and calls
`compute_logits` on those rows only. q/k/v and gate/up are single merged projections
(each checkpoint matrix is loaded into its slice, see `packed_modules_mapping`). The linear
layers store and apply their weights through the `LinearMethod` the platform chose.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import paged_attention, rope_and_write_kv
from engine.lora.context import current_lora
from engine.models.config import ModelArch
from engine.models.layers import RMSNorm, RotaryEmbedding, apply_rope
from engine.models.linear import Linear, LinearMethod, MergedLinear
from engine.models.native_decode import NativeDecodeLayers, decode_layers_natively

# bfloat16 rounds a logit v by at most |v| * 2**-8, so any token whose rounded logit is within
# twice that of the rounded maximum may hold the true maximum (see CausalLM.compute_logits).
BF16_TIE_MARGIN = 2.0**-7
# On CUDA (where a data-dependent count would be a host read), and where a flat distribution puts
# too many tokens near the maximum, the best few per row are taken instead.
REFINED_PER_ROW = 8


class Attention(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int, method: LinearMethod):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q_size = arch.num_heads * arch.head_dim
        self.kv_size = arch.num_kv_heads * arch.head_dim
        self.qkv_proj = MergedLinear(arch.hidden_size, {"q": self.q_size, "k": self.kv_size, "v": self.kv_size},
                                     bias=arch.attention_bias, method=method)
        self.o_proj = Linear(self.q_size, arch.hidden_size, bias=False, method=method)
        self.q_norm: RMSNorm | None = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm: RMSNorm | None = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.scale = arch.head_dim ** -0.5

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        n, h, kvh = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x)
        # q and k heads side by side: [num_tokens, heads + kv_heads, head_dim], rotated in one go
        qk = qkv[:, : self.q_size + self.kv_size].view(n, h + kvh, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:])), dim=1)
        v = qkv[:, self.q_size + self.kv_size:].view(n, kvh, self.head_dim)
        fused = rope_and_write_kv(qk, v, rope, self.layer_idx, h)  # one native call where the backend has it
        if fused is None:
            q, k = apply_rope(qk, *rope).split((h, kvh), dim=1)
            o = paged_attention(q, k, v, self.layer_idx, self.scale)
        else:
            o = paged_attention(*fused, v, self.layer_idx, self.scale, kv_written=True)
        return self.o_proj(o.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, arch: ModelArch, method: LinearMethod):
        super().__init__()
        self.intermediate_size = arch.intermediate_size
        self.gate_up_proj = MergedLinear(arch.hidden_size, {0: arch.intermediate_size, 1: arch.intermediate_size},
                                         bias=False, method=method)
        self.down_proj = Linear(arch.intermediate_size, arch.hidden_size, bias=False, method=method)
        self.native: Any = None  # the native CPU kernels' module, when the engine turned them on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and x.is_cpu:  # silu and mul in one pass, the same roundings
            # (not with a LoRA delta to add to the projection's output first)
            lora = self.gate_up_proj.lora is not None and current_lora() is not None
            fused = None if lora else gate_up_silu_mul(self.gate_up_proj, x)
            return self.down_proj(fused if fused is not None else self.native.silu_and_mul(self.gate_up_proj(x)))
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def gate_up_silu_mul(gate_up_proj: Linear, x: torch.Tensor) -> torch.Tensor | None:
    """The projection and silu-and-mul in one native pass where its method has one for these rows
    (the AMX codes), else None; a traced step swaps it out, so the projection keeps its stop."""
    return gate_up_proj.method.gate_up_silu_mul(gate_up_proj, x)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int, method: LinearMethod):
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = Attention(arch, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = MLP(arch, method)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = (self.input_layernorm(x), x) if residual is None else self.input_layernorm(x, residual)
        x = self.self_attn(rope, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class CausalLM(nn.Module):
    # checkpoint module name -> (our merged module, its shard id): the loader's whole mapping
    packed_modules_mapping: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, arch: ModelArch, method: LinearMethod):
        super().__init__()
        self.arch = arch
        # no initialisation: the loader fills it (and a random init of 28M entries under the
        # meta device's context imports torch._dynamo, ~2 s of every start)
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size,
                                         _weight=torch.empty(arch.vocab_size, arch.hidden_size))
        self.rotary = RotaryEmbedding(arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(arch, i, method) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, bias=False, method=method, keep_dense_weight=True)
        self.tie_weights()
        # every layer in one native call for the decode steps it takes (engine/models/native_decode.py);
        # set by the engine where the layers run on the native kernels
        self.native_layers: NativeDecodeLayers | None = None

    def tie_weights(self) -> None:
        """Share the embedding with the LM head; re-run after moving off the meta device."""
        if self.arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        rope = self.rotary.cos_sin(positions, x.dtype)
        native = decode_layers_natively(self.native_layers, x, rope)
        if native is not None:
            x, residual = native
        else:
            residual = None
            for layer in self.layers:
                x, residual = layer(rope, x, residual)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [num_seqs, hidden] at each sequence's last scheduled position -> float32 logits.

        In bfloat16 / float16 the LM head's outputs are rounded to 8 (or 11) bits of mantissa, so the
        best candidates often tie exactly. Their logits are recomputed with float32 accumulation
        from the same weights (a few rows each), which makes such ties rare and the greedy choice
        that of the unrounded model."""
        out = self.lm_head(hidden, float32_out=True)
        if out.dtype == torch.float32:  # float32 sums: the method's own (GGUF codes), or a float32 model
            return out
        logits = out.float()
        if hidden.dtype != torch.float32:
            _refine_top_logits(logits, hidden, self.lm_head.dense_weight())
        return logits


def _refine_top_logits(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """Recompute in float32, in place, the logits of the tokens that could be each row's true
    maximum. logits: [num_seqs, vocab] float32 (rounded); hidden: [num_seqs, hidden]; weight:
    [vocab, hidden] in the model's dtype."""
    num_seqs, vocab = logits.shape
    per_row = min(REFINED_PER_ROW, vocab)
    if logits.is_cpu:  # the tokens near the maximum (numpy's compare and nonzero are twice as fast here)
        top = logits.amax(dim=-1, keepdim=True)
        threshold = (top - top.abs() * BF16_TIE_MARGIN).numpy()
        near = logits.numpy() >= threshold  # [num_seqs, vocab]
        # Each row's choice depends on that row alone, so a row's logits do not depend on the batch.
        crowded = np.flatnonzero(near.sum(axis=1) > per_row)
        if len(crowded):
            near[crowded] = False
            near[crowded[:, None], logits[crowded].topk(per_row, dim=-1).indices.numpy()] = True
        flat = torch.from_numpy(np.flatnonzero(near))
    else:
        ids = logits.topk(per_row, dim=-1).indices
        flat = (ids + torch.arange(num_seqs, device=ids.device).unsqueeze(1) * vocab).flatten()
    rows, cols = flat // vocab, flat % vocab
    exact = (weight.index_select(0, cols).float() * hidden.index_select(0, rows).float()).sum(dim=-1)
    logits.view(-1).index_copy_(0, flat, exact)
