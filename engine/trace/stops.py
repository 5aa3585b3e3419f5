"""One traced request's stops in one step, from the step's recording of the flat batch.

The recording holds the flat batch's shapes ([num_tokens, ...]); a request's own are the same
with its rows in front, in (batch=1, tokens, features...) order: [num_tokens, 1024] ->
[1, 17, 1024] for a 17-token prompt, whatever it was batched with. The merged projections are
reported as they run (one qkv_proj, one gate_up_proj) and also as the checkpoint's modules
(q_proj, k_proj, v_proj, gate_proj, up_proj), the slices of the merged output, with no time of
their own. The KV write shows the request's layer-0 K cache before and after the step, and
attention the logical scores [1, heads, queries, keys] (which a kernel need not materialise).
Times are the whole step's, shared with every request in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.messages import TraceStop
from engine.models.linear import MergedLinear
from engine.models.llama import CausalLM, DecoderLayer
from engine.trace.recorder import SHAPE_LAYER, StepRecording


@dataclass(frozen=True)
class RequestRows:
    """Where one request sits in the step."""

    tokens: int  # its rows of the flat batch
    logits_rows: int  # its rows of the LM head (1, or 1 + a draft)
    cached_tokens: int  # in the KV cache before the step
    context_tokens: int  # after it


def _notes(model: CausalLM) -> dict[str, str]:
    arch = model.arch
    return {
        "embed_tokens": "token ids -> vectors (a row lookup)",
        "input_layernorm": "RMSNorm; from layer 1 on it adds the residual first, in the same call",
        "qkv_proj": "q, k and v in one matmul (merged); q_proj, k_proj and v_proj are slices of its output",
        "q_norm": "per-head RMSNorm of q (Qwen3)",
        "k_norm": "per-head RMSNorm of k (Qwen3)",
        "rope": f"q and k heads rotated together ({arch.num_heads} + {arch.num_kv_heads}); shapes unchanged",
        "kv_write": "this request's layer-0 K cache before -> after the step (V alike), paged in blocks; "
                    "shapes.written: the K (and V) rows stored",
        "attention": "softmax(q k^T / sqrt(head_dim)) v over the request's keys; shapes.scores is logical "
                     "(not every kernel materialises it); time without the KV write",
        "o_proj": "attention output projection",
        "self_attn": "the whole attention block (qkv_proj to o_proj)",
        "post_attention_layernorm": "RMSNorm after adding the residual, in one call",
        "gate_up_proj": "gate and up in one matmul (merged); gate_proj and up_proj are slices of its output",
        "act_fn": "silu(gate) * up; time: mlp minus its two projections",
        "down_proj": "MLP output projection",
        "mlp": "the whole SwiGLU block",
        "decoder_layer": "the whole decoder layer",
        "norm": "final RMSNorm, after adding the last residual",
        "lm_head": "only at the step's last position of the request: the other rows' logits are never computed",
    }


def _mine(flat: tuple[int, ...], rows: int) -> list[int]:
    """A flat-batch shape with this request's rows in front: [n, ...] -> [1, rows, ...]."""
    return [1, rows, *flat[1:]]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def _minus(total: float | None, *parts: float | None) -> float | None:
    if total is None:
        return None
    return max(0.0, total - sum(p or 0.0 for p in parts))


def model_stops(rec: StepRecording, model: CausalLM, rows: RequestRows) -> list[TraceStop]:
    """The request's stops from the embedding to the LM head, in the order they finished."""
    arch, notes = model.arch, _notes(model)
    layer0 = model.layers[0]
    assert isinstance(layer0, DecoderLayer)
    slices = {"qkv_proj": (layer0.self_attn.qkv_proj, ("q_proj", "k_proj", "v_proj")),
              "gate_up_proj": (layer0.mlp.gate_up_proj, ("gate_proj", "up_proj"))}
    kvh, hd = arch.num_kv_heads, arch.head_dim
    stops: list[TraceStop] = []
    for name in rec.order:
        shapes = rec.shapes[name]
        n = rows.logits_rows if name == "lm_head" else rows.tokens
        shape_in, shape_out = _mine(shapes.input, n), _mine(shapes.output, n)
        seconds = rec.time_of(shapes.level, name)
        all_layers = rec.all_layers(name) if shapes.level == SHAPE_LAYER else None
        stop = TraceStop(name, shape_in, shape_out, _ms(seconds), _ms(all_layers), notes.get(name, ""))
        if name == "down_proj":  # the activation between the merged gate/up and down
            mlp = rec.time_of(SHAPE_LAYER, "mlp")
            act = _minus(mlp, rec.time_of(SHAPE_LAYER, "gate_up_proj"), seconds)
            act_all = _minus(rec.all_layers("mlp"), rec.all_layers("gate_up_proj"), all_layers)
            stops.append(TraceStop("act_fn", [1, n, 2 * arch.intermediate_size], shape_in, _ms(act),
                                   _ms(act_all), notes["act_fn"]))
        if name == "kv_write":
            stop.input, stop.output = [1, kvh, rows.cached_tokens, hd], [1, kvh, rows.context_tokens, hd]
            stop.shapes = {"written": [1, kvh, n, hd]}
        if name == "attention":
            stop.ms = _ms(_minus(seconds, rec.time_of(SHAPE_LAYER, "kv_write")))
            stop.all_layers_ms = _ms(_minus(all_layers, rec.all_layers("kv_write")))
            stop.shapes = {"keys": [1, kvh, rows.context_tokens, hd],
                           "scores": [1, arch.num_heads, n, rows.context_tokens]}
        stops.append(stop)
        if name in slices:
            stops += _slices(name, shape_in, shape_out, *slices[name])
    return stops


def _slices(merged: str, shape_in: list[int], shape_out: list[int], layer: MergedLinear,
            names: tuple[str, ...]) -> list[TraceStop]:
    """The checkpoint's modules inside a merged projection, in its shard order."""
    note = f"a slice of the merged {merged}'s output (its time is {merged}'s)"
    return [TraceStop(name, shape_in, [*shape_out[:-1], size], None, None, note)
            for name, (_, size) in zip(names, layer.shard_offsets.values(), strict=True)]
