"""Linear layers on a GGUF's own Q4_1 / Q8_0 codes (engine/models/gguf_codes.py), through the
native kernel (engine/native/csrc/quant_linear.cpp), for the batch sizes where that is faster.

A decode step of a few rows is bound by the bytes of the weights it reads: the codes are a third
of bf16's (Q4_1: 5 bits per weight with its scale and minimum). A step of many rows is bound by
arithmetic instead, so each layer also has a batch method for the rows above `max_rows`, the
fastest at start-up of: oneDNN's packed matmul on the dense weights; the codes as bf16 tiles on
AMX (engine/models/amx_linear.py, the same weights on a third of the bytes) where the CPU has it;
int8 activations x int8 weights through AVX512-VNNI (engine/models/int8_linear.py) where it has
that. With `--batch-linear int8`, the Q4_1 codes meet int8 activations as well (q4_int8_linear.cpp:
the 4-bit codes straight into VPDPBUSD), which leaves a few rows bound by the bytes of the codes
instead of by turning each code into a bf16; lossy, so not the default. The batch method and the
crossover are measured once at start-up per distinct shape (`measure_batch_methods`) and logged.

The dense weights are the codes de-quantized (exact in float32) and rounded to the engine's
dtype; the int8 weights the same de-quantized codes quantized per output channel.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from engine.models.amx_linear import AmxCodesMethod, amx_ready
from engine.models.batch_invariance import TILE_ROWS, invariant_rows_start
from engine.models.gguf_codes import GroupCodes
from engine.models.q4_int8_batch import Q4Int8BatchMethod, q4_int8_batch_ready
from engine.models.int8_linear import Int8LinearMethod, int8_shape_ready
from engine.models.linear import Linear, LinearMethod, MergedLinear

logger = logging.getLogger(__name__)

ShapeKey = tuple[int, int, str]  # (in_features, out_features, codes format)
Verdict = tuple[int, str, str]  # (rows up to which the codes run, the batch method's name, how the codes run)

# Row counts tried for the crossover; a step never needs the codes beyond the last.
CANDIDATE_ROWS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
BATCH_PROBE_ROWS = 64  # most rows at which the batch methods are compared
CACHE_EVICT_BYTES = 64 << 20  # more than the last-level cache of the CPUs we meet (32 MiB here)


class GroupQuantizedMethod(LinearMethod):
    """One layer's codes (in the kernel's panel layout), its dense method, and the method for the
    rows above the crossover (`batch`: one of `batch_candidates`, the dense method first, then an
    AmxCodesMethod and an Int8LinearMethod where the layer has them; measure_batch_methods picks)."""

    def __init__(self, dense: LinearMethod, codes: GroupCodes, native: ModuleType, max_rows: int = 0,
                 int8_codes: bool = False):
        self.dense, self.native, self.format = dense, native, codes.format
        self.batch: LinearMethod = dense
        self.batch_candidates: list[LinearMethod] = [dense]
        self.codes, self.scales, self.mins = codes.panels()
        # Q4_1 with --batch-linear int8: the same codes in q4_int8_linear.cpp's layout, which the
        # codes' rows then take against int8 activations (None: the codes above, exactly)
        self.int8_codes = codes.int8_tiles() if int8_codes and codes.int8_tiles_ready else None
        self.nbytes = codes.nbytes
        self.max_rows = max_rows  # rows up to which the codes run (0: never); set by measure_batch_methods

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"gguf-{self.format}+{self.batch.name}"

    @property
    def codes_kind(self) -> str:
        """How the codes run, for the start-up log."""
        return self.format if self.int8_codes is None else f"{self.format} x int8"

    def create_weights(self, layer: Linear) -> None:
        self.dense.create_weights(layer)

    def process_weights_after_loading(self, layer: Linear) -> None:
        self.dense.process_weights_after_loading(layer)

    # The crossover is timed at start-up, so it can differ between two engines: batch-invariant
    # rows must not depend on it. They go in tiles of TILE_ROWS rows (Linear.forward), and a step
    # with such rows runs every matmul of at most TILE_ROWS rows on the codes, whose rows do not
    # depend on the batch: the same path alone, in any batch, in any engine.
    invariant_rows_in_tiles = True

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows <= self.max_rows or (rows <= TILE_ROWS and invariant_rows_start() is not None):
            return self.apply_codes(x)
        return self.batch.apply(layer, x)

    def apply_codes(self, x: torch.Tensor, float32_out: bool = False) -> torch.Tensor:
        # batch-invariant rows keep the exact codes; int8 codes are batch-independent too, but
        # the exact ones are what every other engine's invariant rows take
        if self.int8_codes is not None and invariant_rows_start() is None:
            return self.native.q4_int8_linear(x, *self.int8_codes, float32_out)
        return self.native.quant_linear(x, self.codes, self.scales, self.mins, self.format, float32_out)

    def float32_logits(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """float32 outputs accumulated in float32 from the exact weights (no bf16 rounding of
        the result: an LM head needs no tie refinement); above the crossover the batch method's,
        unless the step has batch-invariant rows: those must get the same logits in any batch, so
        then every row takes the codes (whose rows do not depend on the batch)."""
        if x.shape[0] <= self.max_rows or invariant_rows_start() is not None:
            return self.apply_codes(x, float32_out=True)
        return self.batch.float32_logits(layer, x)

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        return self.dense.dense_weight(layer)

    def gate_up_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """The rows above the crossover, where the batch method has a fused kernel (AMX, int8; no
        batch-invariant rows: those go through Linear.forward's tiles)."""
        if x.shape[0] > self.max_rows and invariant_rows_start() is None:
            return self.batch.gate_up_silu_mul(layer, x)
        return None

    def weight_bytes_read(self, layer: Linear, rows: int, dtype: torch.dtype) -> int:
        return self.nbytes if rows <= self.max_rows else self.batch.weight_bytes_read(layer, rows, dtype)

    _INT8_NAMES = ("int8_codes", "int8_scales", "int8_mins")

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {"codes": self.codes, "scales": self.scales, "mins": self.mins}
        if self.int8_codes is not None:  # the codes in the int8-activation layout
            tensors.update(zip(self._INT8_NAMES, self.int8_codes, strict=True))
        return tensors

    def set_kernel_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.codes, self.scales, self.mins = tensors["codes"], tensors["scales"], tensors["mins"]
        if self.int8_codes is not None:
            self.int8_codes = tuple(tensors[name] for name in self._INT8_NAMES)  # type: ignore[assignment]

    def kernel_methods(self) -> list[LinearMethod]:
        return [self, *self.batch.kernel_methods()]

def use_group_codes(model: nn.Module, codes: dict[str, GroupCodes], native: ModuleType, int8: bool,
                    int8_codes: bool = False, amx: bool = False) -> list[str]:
    """Give every linear layer with codes for all its checkpoint matrices a GroupQuantizedMethod,
    with int8 weights for batches if `int8`, AMX tiles of the codes for batches if `amx` (bfloat16
    engines), and Q4_1 codes against int8 activations if `int8_codes` (where the kernels and the
    shape allow); return the names of those left dense. A merged layer stacks its shards' codes in
    its shard order; a tied LM head takes the embedding's."""
    int8 = int8 and native.int8_linear_available()
    int8_codes = int8_codes and int8 and native.q4_int8_linear_available()
    mapping = getattr(model, "packed_modules_mapping", {})
    tied = getattr(getattr(model, "arch", None), "tie_word_embeddings", False)
    dense_left = []
    for name, layer in model.named_modules():
        if not isinstance(layer, Linear):
            continue
        sources = [f"model.{name}.weight"]
        shards = [m for m, (merged, _) in mapping.items() if name.endswith(f".{merged}")]
        if shards:
            assert isinstance(layer, MergedLinear), name
            order = list(layer.shard_offsets)
            shards.sort(key=lambda m: order.index(mapping[m][1]))
            sources = [f"model.{name.rpartition('.')[0]}.{m}.weight" for m in shards]
        elif name == "lm_head":
            sources = ["model.embed_tokens.weight" if tied else "lm_head.weight"]
        parts = [codes.get(s) for s in sources]
        if any(p is None for p in parts) or layer.has_bias:
            dense_left.append(name)
            continue
        stacked = GroupCodes.stack(parts)  # type: ignore[arg-type]
        assert stacked.shape == (layer.output_size, layer.input_size), f"{name}: codes {stacked.shape}"
        if not stacked.panel_ready:  # the kernel's panels and steps do not divide this shape
            dense_left.append(name)
            continue
        method = GroupQuantizedMethod(layer.method, stacked, native, int8_codes=int8_codes)
        if amx and amx_ready(native, stacked):
            method.batch_candidates.append(AmxCodesMethod(stacked, native))
        if int8 and int8_shape_ready(layer.output_size, layer.input_size):
            method.batch_candidates.append(Int8LinearMethod(stacked.dequantize(), native))
        if int8 and q4_int8_batch_ready(native, stacked):
            method.batch_candidates.append(Q4Int8BatchMethod(stacked, native))
        layer.method = method
    return dense_left


def measure_batch_methods(model: nn.Module, dtype: torch.dtype, limit: int, choice: str) -> dict[ShapeKey, Verdict]:
    """For each distinct (in, out, format) shape: the batch method (with `choice` "auto", the
    fastest candidate at min(limit, BATCH_PROBE_ROWS) rows; "int8", "amx" and "dense" as named,
    dense where the shape has no such candidate) and the crossover, the most rows (of CANDIDATE_ROWS, up to
    `limit`) for which the codes beat the batch method at every row count up to it; both set on
    every layer of the shape. A decode step streams every layer's weights from memory (the model
    is larger than the caches), so each timing runs through all the layers of the shape after
    evicting the caches, as a step would meet them."""
    by_shape: dict[ShapeKey, list[Linear]] = {}
    for layer in model.modules():
        if isinstance(layer, Linear) and isinstance(layer.method, GroupQuantizedMethod):
            by_shape.setdefault((layer.input_size, layer.output_size, layer.method.format), []).append(layer)
    evict = torch.zeros(CACHE_EVICT_BYTES, dtype=torch.uint8)
    verdicts = {}
    for key, layers in by_shape.items():
        methods: list[GroupQuantizedMethod] = [layer.method for layer in layers]  # type: ignore[misc]
        chosen = _fastest_batch(methods, layers, dtype, min(limit, BATCH_PROBE_ROWS), evict, choice)
        for method in methods:
            method.batch = method.batch_candidates[chosen]
            method.batch_candidates = [method.batch]  # the others' weights are let go
        max_rows = _crossover(methods, layers, dtype, limit, evict)
        for method in methods:
            method.max_rows = max_rows
        verdicts[key] = (max_rows, methods[0].batch.name, methods[0].codes_kind)
    return verdicts


BATCH_CHOICES = {"int8": Int8LinearMethod.name, "amx": AmxCodesMethod.name}


def _fastest_batch(methods: list[GroupQuantizedMethod], layers: list[Linear], dtype: torch.dtype, rows: int,
                   evict: torch.Tensor, choice: str) -> int:
    """Index in batch_candidates (the same kinds for every layer of a shape) of the batch method."""
    names = [c.name for c in methods[0].batch_candidates]
    if choice != "auto":
        wanted = BATCH_CHOICES.get(choice)
        return names.index(wanted) if wanted in names else 0
    if len(names) == 1:
        return 0
    x = _probe_input(layers, dtype, rows)
    seconds = _cold_seconds([[functools.partial(m.batch_candidates[i].apply, la, x)
                              for m, la in zip(methods, layers, strict=True)] for i in range(len(names))], evict)
    return min(range(len(names)), key=seconds.__getitem__)


def _crossover(methods: list[GroupQuantizedMethod], layers: list[Linear], dtype: torch.dtype, limit: int,
               evict: torch.Tensor) -> int:
    if methods[0].batch is methods[0].dense:
        best, tried = 0, CANDIDATE_ROWS
    else:
        # A lone row always takes the codes: decode at batch 1 on the shipped weights exactly. (The
        # int8 method's kernel can beat the bf16 codes' at one row on a matrix that partly stays
        # in the caches, but it rounds the weights too.)
        best, tried = 1, CANDIDATE_ROWS[1:]
    for rows in (r for r in tried if r <= limit):
        x = _probe_input(layers, dtype, rows)
        codes, batch = _cold_seconds([[functools.partial(m.apply_codes, x) for m in methods],
                                      [functools.partial(m.batch.apply, la, x)
                                       for m, la in zip(methods, layers, strict=True)]], evict)
        if codes >= batch:
            break
        best = rows
    return best


def _probe_input(layers: list[Linear], dtype: torch.dtype, rows: int) -> torch.Tensor:
    return torch.randn(rows, layers[0].input_size, generator=torch.Generator().manual_seed(rows)).to(dtype)


def _cold_seconds(alternatives: list[list[Callable[[], object]]], evict: torch.Tensor,
                  rounds: int = 3) -> list[float]:
    """Per alternative (a list of calls), the fastest over rounds of the time to make every call
    once, the caches evicted before each. The alternatives take turns within each round, and
    the fastest pass is the one least disturbed: whatever else runs on the machine at start-up
    (another server starting, a build) can only add time, and it no longer lands on one
    alternative's passes alone (two servers started together once had one of them take oneDNN
    for the MLP, and run 1.5x slower at 32 streams for its whole life)."""
    for calls in alternatives:
        calls[0]()
    best = [float("inf")] * len(alternatives)
    for _ in range(rounds):
        for i, calls in enumerate(alternatives):
            evict.add_(1)  # writes every line of a buffer larger than the last-level cache
            start = time.perf_counter()
            for call in calls:
                call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def describe_batch_methods(verdicts: dict[ShapeKey, Verdict]) -> str:
    return ", ".join(f"{k}x{n} {kind} up to {rows} rows, then {batch}"
                     for (k, n, _), (rows, batch, kind) in sorted(verdicts.items())) or "none"
