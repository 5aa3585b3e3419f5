"""Times and shapes of the model's operators during one traced engine step.

Installed for that step only and removed after it: two global module hooks (a forward pre-hook
and a forward hook, so every module of the model reports without one hook per module) and timed
stand-ins for the operators that are no modules: `apply_rope` and `paged_attention` as the model
calls them, and the torch backend's `write_kv` (the traced step runs them unfused). A step
without a traced request runs none of this. Shapes are those of the flat batch ([num_tokens,
...]; the LM head's [num_sampled, ...]), kept for layer 0 and for the model-level modules
(embedding, final norm, LM head); times are kept for every layer, so a stop can also be summed
over the layers. On CUDA every timestamp waits for the queued kernels (`torch.cuda.synchronize`),
so a traced step is slower than an untraced one.
"""
from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from engine.attention.forward_context import get_forward_context
from engine.models import llama

MODEL_LEVEL = -1  # the layer index of the stops outside the decoder layers
SHAPE_LAYER = 0  # the layer whose shapes are kept, as in a forward-hook table of layer 0


def stops_of_modules(model: nn.Module) -> dict[nn.Module, tuple[int, str]]:
    """Each module of the model -> (its layer or MODEL_LEVEL, its stop name): the last part of
    its name (`layers.3.self_attn.qkv_proj` -> (3, "qkv_proj")); a decoder layer itself is
    "decoder_layer". The root, the RoPE tables and the layer list are no stops."""
    stops: dict[nn.Module, tuple[int, str]] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if name in ("", "rotary", "layers"):
            continue
        if parts[0] == "layers":
            stops[module] = (int(parts[1]), parts[-1] if len(parts) > 2 else "decoder_layer")
        else:
            stops[module] = (MODEL_LEVEL, parts[-1])
    return stops


@dataclass(frozen=True)
class FlatShapes:
    level: int  # SHAPE_LAYER or MODEL_LEVEL
    input: tuple[int, ...]
    output: tuple[int, ...]


class StepRecording:
    """What one step's operators did. `times[(layer, stop)]` in seconds; `shapes[stop]` and
    `order` (the stops in the order they finished, like forward hooks) for layer 0 and the
    model level; `attention_metadata` is the backend's metadata of the step."""

    def __init__(self, stops: dict[nn.Module, tuple[int, str]], backend: Any, device: torch.device):
        self.stops = stops
        self.backend = backend
        self.sync: Callable[[], None] | None = (lambda: torch.cuda.synchronize(device)) \
            if device.type == "cuda" else None
        self.times: dict[tuple[int, str], float] = defaultdict(float)
        self.shapes: dict[str, FlatShapes] = {}
        self.order: list[str] = []
        self.attention_metadata: Any = None
        self._starts: dict[nn.Module, float] = {}
        self._layer = MODEL_LEVEL  # the decoder layer running now (for the stand-in functions)

    def now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def time_of(self, layer: int, stop: str) -> float | None:
        return self.times.get((layer, stop))

    def all_layers(self, stop: str) -> float | None:
        found = [s for (layer, name), s in self.times.items() if name == stop and layer != MODEL_LEVEL]
        return sum(found) if found else None

    @contextlib.contextmanager
    def installed(self) -> Iterator[StepRecording]:
        handles = [register_module_forward_pre_hook(self._before), register_module_forward_hook(self._after)]
        # The traced step takes the modules (not all layers in one native call) and the unfused
        # RoPE and KV write (no `rope_and_write_kv`), so each keeps its own stop with its shapes;
        # other steps run the fused kernels where there are some.
        swaps = [(llama, "apply_rope", self._timed("rope", llama.apply_rope)),
                 (llama, "paged_attention", self._timed("attention", llama.paged_attention)),
                 (llama, "rope_and_write_kv", _unfused), (llama, "decode_layers_natively", _unfused),
                 (llama, "gate_up_silu_mul", _unfused)]
        backend_module = sys.modules[type(self.backend).__module__]
        write_kv = getattr(backend_module, "write_kv", None)
        if write_kv is not None:  # the torch backend's; another backend's cache write has no stop of its own
            swaps.append((backend_module, "write_kv", self._timed("kv_write", write_kv, key_arg=2)))
        originals = [(module, name, getattr(module, name)) for module, name, _ in swaps]
        try:
            for module, name, stand_in in swaps:
                setattr(module, name, stand_in)
            yield self
        finally:
            for module, name, original in originals:
                setattr(module, name, original)
            for handle in handles:
                handle.remove()

    def _before(self, module: nn.Module, args: tuple) -> None:
        entry = self.stops.get(module)
        if entry is None:
            return
        if entry[0] != MODEL_LEVEL:
            self._layer = entry[0]
        self._starts[module] = self.now()

    def _after(self, module: nn.Module, args: tuple, output: Any) -> None:
        entry = self.stops.get(module)
        if entry is None or module not in self._starts:
            return
        first_tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)  # a layer's x, not its rope
        self._record(*entry, self.now() - self._starts.pop(module), first_tensor, output)

    def _timed(self, stop: str, fn: Callable, key_arg: int = 0) -> Callable:
        """`fn` timed as `stop` of the current layer; shapes from its argument `key_arg`."""

        def timed(*args, **kwargs):
            if stop == "attention":
                self._layer = args[3]  # paged_attention(q, k, v, layer_idx, scale)
            start = self.now()
            out = fn(*args, **kwargs)
            layer = self._layer
            if stop == "attention" and layer == SHAPE_LAYER:
                self.attention_metadata = get_forward_context().metadata
            self._record(layer, stop, self.now() - start, args[key_arg], out if out is not None else args[key_arg])
            return out

        return timed

    def _record(self, layer: int, stop: str, seconds: float, first_input: Any, output: Any) -> None:
        self.times[(layer, stop)] += seconds
        if layer not in (SHAPE_LAYER, MODEL_LEVEL):
            return
        if isinstance(output, tuple):  # a norm with residual: (out, residual)
            output = output[0]
        shape_in = tuple(first_input.shape) if isinstance(first_input, torch.Tensor) else ()
        shape_out = tuple(output.shape) if isinstance(output, torch.Tensor) else ()
        self.shapes[stop] = FlatShapes(layer, shape_in, shape_out)
        self.order.append(stop)


def _unfused(*args: Any, **kwargs: Any) -> None:
    """`rope_and_write_kv`, `decode_layers_natively` and `gate_up_silu_mul` for a traced step: no
    fused path (the model runs its modules, rotates with torch ops, the backend's `forward` writes
    the cache, and the MLP's projection runs alone)."""
    return None
