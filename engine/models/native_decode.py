"""A decode step's decoder layers in one native call, for the steps that allow it.

At one row a decode step reads about 96 MB of codes in about 3.3 ms here, and the ~300 Python
module and kernel calls between those reads cost about as much again. `NativeDecodeLayers` hands
every layer's weights and KV cache to `DecodeLayers` (engine/native/csrc/decode_layers.cpp) once;
a step then runs all the layers in one call, through the same kernels in the same order as the
modules, so its result is bitwise theirs.

A step goes this way when every row is a one-query decode row that the backend attends with the
native kernel and no row asks for batch invariance (`AttentionBackend.native_decode_inputs`),
the rows are within every layer's codes crossover (above it a layer takes its batch method: in
the call too where every layer's is a native kernel, int8 or AMX; a dense one only through the modules),
and the step's KV caches are those it was built with; any other step runs the modules. Rows that
run LoRA adapters add their deltas in the call (engine/native/csrc/lora_delta.cpp, the kernel the
modules add them with), once the engine attached the adapter slots (`attach_lora`). A traced
step swaps `decode_layers_natively` out (engine/trace/recorder.py), so every module keeps its stop.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from engine.attention.forward_context import get_forward_context
from engine.lora.context import current_lora
from engine.models.amx_linear import AmxCodesMethod
from engine.models.group_quantized import GroupQuantizedMethod
from engine.models.int8_linear import Int8LinearMethod
from engine.models.q4_int8_batch import Q4Int8BatchMethod


EVERY_STEP = 1 << 30  # max_rows when every layer's batch method runs in the call too


class NativeDecodeLayers:
    def __init__(self, model: Any, native: ModuleType, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]):
        why_not = unsupported_reason(model)
        assert why_not is None, why_not
        arch, layers = model.arch, list(model.layers)  # a CausalLM of engine/models/llama.py
        norms, methods = [], []
        for layer in layers:
            norms += [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()]
            methods += [layer.self_attn.qkv_proj.method, layer.self_attn.o_proj.method,
                        layer.mlp.gate_up_proj.method, layer.mlp.down_proj.method]
        # Rows up to which every layer runs its codes (the measured crossovers, set before this);
        # where every layer's batch method is a native kernel too (int8 or AMX), every decode step.
        none = torch.empty(0, dtype=torch.uint8)
        batches = [native_batch(m, none) for m in methods]
        self.max_rows = EVERY_STEP if all(kind for kind, *_ in batches) else min(m.max_rows for m in methods)
        self.kv_caches = kv_caches
        self.has_lora = False
        int8 = [m.int8_codes or (none, none, none) for m in methods]
        self.impl = native.DecodeLayers(norms, [m.codes for m in methods], [m.scales for m in methods],
                                        [m.mins for m in methods], [m.format for m in methods],
                                        [c for c, _, _ in int8], [s for _, s, _ in int8], [n for _, _, n in int8],
                                        *[list(column) for column in zip(*batches, strict=True)],
                                        [m.max_rows for m in methods],
                                        [k for k, _ in kv_caches], [v for _, v in kv_caches], arch.num_heads,
                                        arch.num_kv_heads, arch.head_dim, arch.rms_norm_eps, arch.head_dim ** -0.5)


    def attach_lora(self, model: Any) -> None:
        """Hand the call every linear's LoRA slots (engine/lora/slots.py), shared with the modules:
        adapters loaded into them later are what the call computes with."""
        none = torch.empty(0)
        a, bt, slices = [], [], []
        for layer in model.layers:
            for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                           layer.mlp.down_proj):
                a.append(none if linear.lora is None else linear.lora.a)
                bt.append(none if linear.lora is None else linear.lora.bt)
                slices.append([] if linear.lora is None else linear.lora.kernel_slices)
        self.impl.set_lora(a, bt, slices)
        self.has_lora = True


def native_batch(method: GroupQuantizedMethod, none: torch.Tensor) -> tuple[str, torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """(kind, codes, scales, mins) of the layer's batch method where DecodeLayers runs it, else ("", none...)."""
    batch = method.batch
    if isinstance(batch, Int8LinearMethod):
        return "int8", batch.codes, batch.scales, none
    if isinstance(batch, AmxCodesMethod):
        return "amx", batch.codes, batch.scales, batch.mins
    if isinstance(batch, Q4Int8BatchMethod):
        return "q4int8", batch.codes, batch.scales, batch.mins
    return "", none, none, none


def unsupported_reason(model: Any) -> str | None:
    """Why the model's layers cannot run as one native call, or None when they can."""
    arch = getattr(model, "arch", None)
    if arch is None or not hasattr(model, "layers"):
        return "not a decoder of engine/models/llama.py"
    if arch.qk_norm:
        return "per-head q/k norms (Qwen3)"
    for layer in model.layers:
        linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        if not all(isinstance(linear.method, GroupQuantizedMethod) for linear in linears):
            return "a layer's linears are not all on GGUF codes"
        if layer.input_layernorm.native is None or layer.mlp.native is None:
            return "the native kernels are off for the model's norms or MLP"
    return None


def decode_layers_natively(layers: NativeDecodeLayers | None, x: torch.Tensor,
                           rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The last layer's (output, residual) for this step's embeddings x [rows, hidden], or None
    where the step is not one the native call takes (the caller then runs the modules). Rows that
    run LoRA adapters get their deltas in the call, from the slots `attach_lora` handed it."""
    if layers is None or x.shape[0] > layers.max_rows:
        return None
    lora = current_lora()
    if lora is not None and not layers.has_lora:
        return None
    ctx = get_forward_context()
    if ctx.kv_caches is not layers.kv_caches:
        return None
    inputs = ctx.backend.native_decode_inputs(ctx.metadata, x.shape[0])
    if inputs is None:
        return None
    cos, sin = rope
    return layers.impl.forward(x, cos, sin, *inputs, None if lora is None else lora.token_slots)
