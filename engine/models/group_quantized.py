"""Linear layers on a GGUF's own Q4_1 / Q8_0 codes (engine/models/gguf_codes.py), through the
native kernel (engine/native/csrc/quant_linear.cpp), for the batch sizes where that is faster.

A decode step of a few rows is bound by the bytes of the weights it reads: the codes are a third
of bf16's (Q4_1: 5 bits per weight with its scale and minimum). A step of many rows is bound by
arithmetic instead, where oneDNN's packed bf16 matmul wins; so each layer keeps its dense method
too and `max_rows` says up to how many rows the codes run. That crossover is measured once at
start-up per distinct shape (`measure_max_rows`) and logged.

The dense weights are the codes de-quantized (exact in float32) and rounded to the engine's
dtype: above the crossover a row sees those rounded weights.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from engine.models.batch_invariance import TILE_ROWS, invariant_rows_start
from engine.models.gguf_codes import GroupCodes
from engine.models.linear import Linear, LinearMethod, MergedLinear

logger = logging.getLogger(__name__)

# Row counts tried for the crossover; a step never needs the codes beyond the last.
CANDIDATE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
CACHE_EVICT_BYTES = 64 << 20  # more than the last-level cache of the CPUs we meet (32 MiB here)


class GroupQuantizedMethod(LinearMethod):
    """One layer's codes (in the kernel's panel layout) and the dense method for larger batches."""

    def __init__(self, dense: LinearMethod, codes: GroupCodes, native: ModuleType, max_rows: int = 0):
        self.dense, self.native, self.format = dense, native, codes.format
        self.codes, self.scales, self.mins = codes.panels()
        self.nbytes = codes.nbytes
        self.max_rows = max_rows  # rows up to which the codes run (0: never); set by measure_max_rows
        self.name = f"gguf-{codes.format}+{dense.name}"

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
        return self.dense.apply(layer, x)

    def apply_codes(self, x: torch.Tensor, float32_out: bool = False) -> torch.Tensor:
        return self.native.quant_linear(x, self.codes, self.scales, self.mins, self.format, float32_out)

    def float32_logits(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """float32 outputs accumulated in float32 from the exact weights (no bf16 rounding of
        the result: an LM head needs no tie refinement); None above the crossover, unless the
        step has batch-invariant rows: those must get the same logits in any batch, so then every
        row takes the codes (whose rows do not depend on the batch)."""
        if x.shape[0] <= self.max_rows or invariant_rows_start() is not None:
            return self.apply_codes(x, float32_out=True)
        return None

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        return self.dense.dense_weight(layer)

    def weight_bytes_read(self, layer: Linear, rows: int, dtype: torch.dtype) -> int:
        return self.nbytes if rows <= self.max_rows else self.dense.weight_bytes_read(layer, rows, dtype)


def use_group_codes(model: nn.Module, codes: dict[str, GroupCodes], native: ModuleType) -> list[str]:
    """Give every linear layer with codes for all its checkpoint matrices a GroupQuantizedMethod;
    return the names of those left dense. A merged layer stacks its shards' codes in its shard
    order; a tied LM head takes the embedding's."""
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
        layer.method = GroupQuantizedMethod(layer.method, stacked, native)
    return dense_left


def measure_max_rows(model: nn.Module, dtype: torch.dtype, limit: int) -> dict[tuple[int, int, str], int]:
    """For each distinct (in, out, format) shape, the most rows (of CANDIDATE_ROWS, up to
    `limit`) for which the codes beat the dense method at every row count up to it; set on every
    such layer. A decode step streams every layer's weights from memory (the model is larger than
    the caches), so each timing runs through all the layers of the shape after evicting the
    caches, as a step would meet them."""
    by_shape: dict[tuple[int, int, str], list[Linear]] = {}
    for layer in model.modules():
        if isinstance(layer, Linear) and isinstance(layer.method, GroupQuantizedMethod):
            by_shape.setdefault((layer.input_size, layer.output_size, layer.method.format), []).append(layer)
    evict = torch.zeros(CACHE_EVICT_BYTES, dtype=torch.uint8)
    verdicts = {}
    for key, layers in by_shape.items():
        verdicts[key] = _crossover(layers, dtype, limit, evict)
        for layer in layers:
            layer.method.max_rows = verdicts[key]  # type: ignore[attr-defined]
    return verdicts


def _crossover(layers: list[Linear], dtype: torch.dtype, limit: int, evict: torch.Tensor) -> int:
    best = 0
    methods: list[GroupQuantizedMethod] = [layer.method for layer in layers]  # type: ignore[misc]
    for rows in (r for r in CANDIDATE_ROWS if r <= limit):
        x = torch.randn(rows, layers[0].input_size, generator=torch.Generator().manual_seed(rows)).to(dtype)
        codes = _cold_seconds([functools.partial(m.apply_codes, x) for m in methods], evict)
        dense = _cold_seconds([functools.partial(m.dense.apply, la, x) for m, la in zip(methods, layers, strict=True)],
                              evict)
        if codes >= dense:
            break
        best = rows
    return best


def _cold_seconds(calls: list[Callable[[], object]], evict: torch.Tensor, rounds: int = 3) -> float:
    """Median over rounds of the time to make every call once, the caches evicted before each."""
    calls[0]()
    times = []
    for _ in range(rounds):
        evict.add_(1)  # writes every line of a buffer larger than the last-level cache
        start = time.perf_counter()
        for call in calls:
            call()
        times.append(time.perf_counter() - start)
    return sorted(times)[rounds // 2]


def describe_max_rows(verdicts: dict[tuple[int, int, str], int]) -> str:
    return ", ".join(f"{k}x{n} {fmt} up to {rows} rows" for (k, n, fmt), rows in sorted(verdicts.items())) or "none"
