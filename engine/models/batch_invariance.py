"""Batch-invariant rows through the linear layers: each row's output bitwise independent of how
many rows share its matmul and of where it sits among them.

A GEMM library may pick its kernel (and so the order in which it sums over the input dimension)
by the number of rows M: oneDNN gives a row alone (M=1, a GEMV) of SmolLM2's down_proj (1536
inputs) different low bits than the same row among others. So at start-up each distinct linear
shape of the model is probed (`probe_min_rows`): where every batch size gives a row the same
bits, batch-invariant rows ride the normal matmul at no cost; where only a lone row differs, a
lone invariant row is padded to two; where the result depends on the batch size in general,
invariant rows are applied in tiles of exactly `TILE_ROWS` rows (zero-padded), a fixed shape
whose per-row result does not depend on the other rows.

The runner lays batch-invariant requests out last in the flat batch, so their rows are one tail;
it names where that tail starts with `invariant_rows_from(...)` around the model's forward (token
rows) and around the LM head (logits rows).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch

TILE_ROWS = 4  # rows per matmul for invariant rows where the kernel depends on M
# Batch sizes the probe tries (plus all its rows at once), over this many rows
PROBE_ROWS = (3, 4, 7, 8, 16, 31)
PROBE_ROWS_TOTAL = 64

_invariant_from: contextvars.ContextVar[int | None] = contextvars.ContextVar("invariant_rows_from", default=None)


@contextlib.contextmanager
def invariant_rows_from(start: int | None) -> Iterator[None]:
    """Rows [start, end) of every linear input inside this block are batch-invariant rows
    (None: there are none)."""
    token = _invariant_from.set(start)
    try:
        yield
    finally:
        _invariant_from.reset(token)


def invariant_rows_start() -> int | None:
    return _invariant_from.get()


def apply_in_tiles(apply: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, start: int) -> torch.Tensor:
    """x: [rows, in]. Rows before `start` in one matmul, rows from `start` in zero-padded tiles of
    TILE_ROWS rows, one matmul each."""
    head = apply(x[:start]) if start else None
    tail = x[start:]
    num_tail = tail.shape[0]
    pad = -num_tail % TILE_ROWS
    if pad:
        tail = torch.cat((tail, tail.new_zeros(pad, tail.shape[1])))
    tiles = [apply(tile) for tile in tail.split(TILE_ROWS)]
    out = torch.cat(tiles if head is None else [head, *tiles])
    return out[: start + num_tail]


def probe_min_rows(apply: Callable[[torch.Tensor], torch.Tensor], input_size: int, dtype: torch.dtype,
                   device: torch.device, max_rows: int) -> int | None:
    """The fewest rows from which `apply` ([rows, input_size] -> [rows, out]) gives every row the
    same bits whatever the number of rows: 1 (any batch), 2 (any batch but a lone row: a GEMV
    kernel), or None (it depends on the batch size; use fixed tiles).

    A different summation order changes a float32 accumulator in its last bits, which a bfloat16
    output mostly rounds away, so the probe compares every element of PROBE_ROWS_TOTAL rows, each
    computed in batches of every probed size, against the same rows computed two at a time."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    num_rows = min(PROBE_ROWS_TOTAL, max_rows)
    x = torch.randn(num_rows, input_size, generator=generator).to(device, dtype)

    def in_batches_of(size: int) -> torch.Tensor:
        outs = [apply(chunk) for chunk in x.split(size)]
        if size > 1 and outs[-1].shape[0] == 1:  # no lone row where batches are meant
            outs[-1] = apply(x[-2:])[1:]
        return torch.cat(outs)

    pairs = in_batches_of(2)
    sizes = sorted({m for m in PROBE_ROWS if 2 < m <= num_rows} | {num_rows})
    if not all(torch.equal(in_batches_of(size), pairs) for size in sizes):
        return None
    if max_rows > num_rows:  # the largest batch the layer sees, the probe rows first
        extra = torch.randn(max_rows - num_rows, input_size, generator=generator).to(device, dtype)
        if not torch.equal(apply(torch.cat((x, extra)))[:num_rows], pairs):
            return None
    return 1 if torch.equal(in_batches_of(1), pairs) else 2


def describe_invariance(special: dict[str, int | None]) -> str:
    """For the log: how invariant rows pass the layers (`special`: layer name -> min rows, for the
    layers where it is not 1)."""
    if not special:
        return "through the same matmuls as the other rows (every linear shape keeps a row's bits in any batch)"
    kinds: dict[int | None, set[str]] = {}
    for name, min_rows in special.items():
        kinds.setdefault(min_rows, set()).add(name.rsplit(".", 1)[-1])
    parts = [f"a lone row padded to two in {', '.join(sorted(kinds[2]))}"] if 2 in kinds else []
    if None in kinds:
        parts.append(f"in tiles of {TILE_ROWS} rows in {', '.join(sorted(kinds[None]))}")
    return "; ".join(parts) + "; the same matmuls as the other rows elsewhere"
