"""Linear layers that own their weights, and the methods that store and apply them.

A layer creates its parameters through its `LinearMethod`, loads checkpoint tensors through its
own `weight_loader` (a merged layer places each checkpoint matrix in its slice of the stacked
weight), and lets the method rework the loaded weight once (`process_weights_after_loading`), for
example into oneDNN's packed layout. The reworked weight stays a parameter of the model, so
`named_parameters()` still lists each layer's weight, whatever its storage (a packed LM head also
keeps its dense weight as a plain attribute, for row lookups: for a tied head, the embedding).

Methods: the base `LinearMethod` (dense: torch's own matmul; CUDA, and CPUs without a packed
path) and `OneDnnPackedMethod` (weights pre-packed once for oneDNN, which reads them faster for the
small-M matmuls of decode; the platform decides which one runs, see `engine/platform.py`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.malloc import pack_on_huge_pages
from engine.lora.context import current_lora
from engine.models.batch_invariance import apply_in_tiles, invariant_rows_start, probe_min_rows

if TYPE_CHECKING:
    from engine.lora.slots import LoraSlots


class LinearMethod:
    """How a linear layer stores and applies its weight. This base is the dense method: weights
    [out, in] applied with F.linear."""

    name = "dense"
    # Batch-invariant rows always in fixed tiles (no probe): for a method whose path depends on
    # something other than the rows themselves (group_quantized.py: a timed crossover)
    invariant_rows_in_tiles = False

    def create_weights(self, layer: Linear) -> None:
        layer.weight = nn.Parameter(torch.empty(layer.output_size, layer.input_size), requires_grad=False)
        layer.bias = nn.Parameter(torch.empty(layer.output_size), requires_grad=False) if layer.has_bias else None

    def process_weights_after_loading(self, layer: Linear) -> None:
        pass

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias)

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        """The weight as a plain [out, in] tensor (for row lookups such as the LM head's)."""
        return layer.weight

    def weight_bytes_read(self, layer: Linear, rows: int, dtype: torch.dtype) -> int:
        """Bytes of weights one matmul of `rows` rows reads (the dense matrix in `dtype`)."""
        return layer.output_size * layer.input_size * dtype.itemsize

    def float32_logits(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """float32 outputs accumulated in float32 from unrounded weights, where the method has
        them at no extra cost (an LM head then needs no tie refinement); None: it has not."""
        return None

    def gate_up_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of a merged [gate | up] projection of x in one pass where the method has
        such a kernel for these rows, bitwise silu_and_mul of its own output; None: it has not."""
        return None

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        """The weight tensors a native kernel of this method reads at every step, by name (the
        engine copies them onto huge pages: weights_on_huge_pages); none for the torch methods."""
        return {}

    def set_kernel_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Take copies of kernel_tensors() in their place."""
        for name, tensor in tensors.items():
            setattr(self, name, tensor)

    def kernel_methods(self) -> list[LinearMethod]:
        """This method and those it hands some row counts to, whose kernel tensors move with it."""
        return [self]


class OneDnnPackedMethod(LinearMethod):
    """Weights reordered once into oneDNN's blocked layout for a typical batch size (bf16 uses the
    CPU's AVX512-BF16 / AMX units where oneDNN finds them)."""

    name = "onednn-packed"

    def __init__(self, batch_hint: int):
        self.batch_hint = batch_hint

    def process_weights_after_loading(self, layer: Linear) -> None:
        dense = layer.weight.detach()
        if layer.keep_dense_weight:
            layer.dense = dense  # for row lookups; for a tied LM head this is the embedding itself
        packed = torch.ops.mkldnn._reorder_linear_weight(dense, self.batch_hint)
        layer.weight = nn.Parameter(packed, requires_grad=False)
        # The same tensors as a plain attribute: a decode step makes ~120 of these calls, and a
        # parameter lookup goes through nn.Module.__getattr__.
        layer.packed_args = (packed, None if layer.bias is None else layer.bias.detach())

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        weight, bias = layer.packed_args  # type: ignore[misc]  # set in process_weights_after_loading
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        assert layer.dense is not None, "packed layer without a dense copy (keep_dense_weight=False)"
        return layer.dense


class Linear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool, method: LinearMethod,
                 keep_dense_weight: bool = False):
        super().__init__()
        self.input_size, self.output_size, self.has_bias = input_size, output_size, bias
        self.method = method
        self.keep_dense_weight = keep_dense_weight
        self.dense: torch.Tensor | None = None
        self.packed_args: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by a packing method
        self.weight: torch.Tensor  # a Parameter; tied layers share another module's
        self.bias: torch.Tensor | None
        # From how many rows the method's matmul gives a row the same bits in any batch (1 or 2),
        # as probed by `probe_batch_invariance`; None (not known): batch-invariant rows go in tiles.
        self.invariant_min_rows: int | None = None
        # LoRA adapter slots (engine/lora), when the engine serves adapters on this projection:
        # their delta is added to the method's output, whatever the method
        self.lora: LoraSlots | None = None
        method.create_weights(self)

    def forward(self, x: torch.Tensor, float32_out: bool = False) -> torch.Tensor:
        """x @ W^T (+ b) in x's dtype; with `float32_out`, float32 sums from unrounded weights
        where the method has them (see `LinearMethod.float32_logits`), else still x's dtype. Rows
        that run a LoRA adapter this step get its delta added."""
        out = self._base_forward(x, float32_out)
        if self.lora is not None:
            step = current_lora()
            if step is not None:
                self.lora.add_delta(x, out, step)
        return out

    def _base_forward(self, x: torch.Tensor, float32_out: bool) -> torch.Tensor:
        if float32_out:
            exact = self.method.float32_logits(self, x)
            if exact is not None:
                return exact
        if self.invariant_min_rows != 1:
            start = invariant_rows_start()
            if start is not None and start < x.shape[0]:
                if self.invariant_min_rows is None:
                    return apply_in_tiles(self.apply_method, x, start)
                if x.shape[0] == 1:  # a lone row: with a zero row, so not through the GEMV kernel
                    return self.method.apply(self, torch.cat((x, torch.zeros_like(x))))[:1]
        return self.method.apply(self, x)

    def apply_method(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        assert shard_id is None, f"{type(self).__name__} has no shards"
        assert param.shape == loaded.shape, f"shape {tuple(loaded.shape)} for a parameter of {tuple(param.shape)}"
        param.data.copy_(loaded)

    def process_weights_after_loading(self) -> None:
        self.method.process_weights_after_loading(self)

    def dense_weight(self) -> torch.Tensor:
        return self.method.dense_weight(self)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.has_bias}, method={self.method.name}"


class MergedLinear(Linear):
    """Several checkpoint matrices stacked along the output dimension (q/k/v, or gate/up), so one
    matmul computes them all. `shards` maps each checkpoint shard id to its output size."""

    def __init__(self, input_size: int, shards: dict[str | int, int], bias: bool, method: LinearMethod):
        self.shard_offsets: dict[str | int, tuple[int, int]] = {}
        offset = 0
        for shard_id, size in shards.items():
            self.shard_offsets[shard_id] = (offset, size)
            offset += size
        super().__init__(input_size, offset, bias, method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        assert shard_id in self.shard_offsets, f"unknown shard {shard_id!r}"
        start, size = self.shard_offsets[shard_id]
        assert loaded.shape[0] == size, f"shard {shard_id!r}: {loaded.shape[0]} rows, expected {size}"
        param.data[start:start + size].copy_(loaded)


def weight_bytes_per_step(model: nn.Module, rows: int, dtype: torch.dtype) -> int:
    """Bytes of weights a step of `rows` rows reads through the model's linear layers (each once;
    the LM head too; the embedding lookup and the norms are not counted)."""
    return sum(m.method.weight_bytes_read(m, rows, dtype) for m in model.modules() if isinstance(m, Linear))


def weight_bytes_per_element(model: nn.Module, rows: int, dtype: torch.dtype) -> float:
    """`weight_bytes_per_step` per weight of the linear layers (2 for bf16; 0.6-0.7 on GGUF codes)."""
    weights = sum(m.input_size * m.output_size for m in model.modules() if isinstance(m, Linear))
    return weight_bytes_per_step(model, rows, dtype) / weights


def probe_batch_invariance(model: nn.Module, dtype: torch.dtype, device: torch.device, max_rows: int,
                           max_head_rows: int) -> dict[str, int | None]:
    """Probe each distinct linear shape of `model` once (`engine.models.batch_invariance`) and set
    its layers' `invariant_min_rows`; return it for the layers where it is not 1. The LM head sees
    at most `max_head_rows` rows a step, every other layer `max_rows`."""
    verdicts: dict[tuple[int, int, str, int], int | None] = {}
    special = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, Linear):
            continue
        rows = max_head_rows if name.endswith("lm_head") else max_rows
        key = (layer.input_size, layer.output_size, layer.method.name, rows)
        if key not in verdicts:
            verdicts[key] = None if layer.method.invariant_rows_in_tiles \
                else probe_min_rows(layer.apply_method, layer.input_size, dtype, device, rows)
        layer.invariant_min_rows = verdicts[key]
        if layer.invariant_min_rows != 1:
            special[name] = layer.invariant_min_rows
    return special


def weights_on_huge_pages(model: nn.Module) -> int:
    """Every linear layer's kernel tensors (LinearMethod.kernel_tensors) copied into one buffer on
    2 MiB pages (engine/malloc.py); returns their bytes. Call it once the methods are final and
    before anything keeps references to the old tensors (the native decode layers)."""
    methods = list({id(k): k for m in model.modules() if isinstance(m, Linear) for k in m.method.kernel_methods()}
                   .values())
    named = [method.kernel_tensors() for method in methods]
    tensors = [t for tensors in named for t in tensors.values()]
    if not tensors:
        return 0
    copies = iter(pack_on_huge_pages(tensors))
    for method, tensors_of in zip(methods, named, strict=True):
        method.set_kernel_tensors({name: next(copies) for name in tensors_of})
    return sum(t.numel() * t.element_size() for t in tensors)
