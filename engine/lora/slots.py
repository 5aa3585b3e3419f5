"""One linear layer's adapter slots, and the LoRA delta of a step in punica's shape.

A layer that several checkpoint projections share (qkv_proj: q, k, v; gate_up_proj: gate, up) has,
per resident slot, the slices' A matrices stacked along the rank, [slices * max_rank, in], and B
transposed as the block-diagonal [slices * max_rank, out] that puts each slice's update in its own
output columns, with the adapter's scaling folded in: so a group of rows costs one shrink (x @ A^T)
and one expand (@ B^T, added to the base output) whatever the slices. A slice the adapter leaves
out, and ranks under max_rank, are zeros.

Where the delta runs: on the CPU the native kernel (engine/native/csrc/lora_delta.cpp, one call
for the whole step; the one-call decode layers take the same tensors), on CUDA the Triton kernels
(engine/lora/triton_ops.py); else torch, a loop over the step's slot groups (at most --max-loras),
never over requests, the rows of a group picked with index_select and added back with index_add_.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.lora.context import StepLora


class LoraSlots:
    def __init__(self, input_size: int, slices: list[tuple[str, int, int]], max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device):
        self.slices = slices  # (checkpoint module name, first output column, output columns)
        self.max_rank = max_rank
        output_size = sum(size for _, _, size in slices)
        width = len(slices) * max_rank
        self.a = torch.zeros(max_loras, width, input_size, dtype=dtype, device=device)
        self.bt = torch.zeros(max_loras, width, output_size, dtype=dtype, device=device)
        self.active = [False] * max_loras  # a slot whose adapter has none of this layer's modules adds nothing
        # the native kernel's expand slices: each slice's rank rows of B^T and its output columns
        self.kernel_slices = [v for i, (_, start, size) in enumerate(slices)
                              for v in (i * max_rank, (i + 1) * max_rank, start, start + size)]
        self._width = [0] * max_loras  # the rank columns in use, the rest zeros (skipped)
        # on CUDA the delta is the Triton kernels' (engine/lora/triton_ops.py): two launches for the
        # whole step instead of a few small matmuls per slot
        self.triton = device.type == "cuda"
        self.native: Any = None  # the native CPU kernels' module, where the engine has them

    def slice_index(self, module: str) -> int:
        return next(i for i, (name, _, _) in enumerate(self.slices) if name == module)

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.bt[slot].zero_()
        self.active[slot] = False
        self._width[slot] = 0

    def set(self, slot: int, module: str, a: torch.Tensor, b_scaled: torch.Tensor) -> None:
        """a: [r, in]; b_scaled: [out_slice, r], scaling folded in."""
        i = self.slice_index(module)
        _, start, size = self.slices[i]
        r = a.shape[0]
        col = i * self.max_rank
        self.a[slot, col:col + r].copy_(a)
        self.bt[slot, col:col + r, start:start + size].copy_(b_scaled.t())
        self.active[slot] = True
        self._width[slot] = max(self._width[slot], col + r)

    def add_delta(self, x: torch.Tensor, out: torch.Tensor, step: StepLora) -> None:
        """out[rows] += (x[rows] @ A_slot^T) @ B_slot^T for every slot group of the step, in place."""
        if self.triton:
            from engine.lora.triton_ops import add_lora_delta

            add_lora_delta(x, out, self.a, self.bt.transpose(1, 2), step.token_slots)
            return
        if self.native is not None and x.is_cpu and out.is_contiguous():
            self.native.lora_add_delta(x.contiguous(), out, self.a, self.bt, step.token_slots, self.kernel_slices)
            return
        for slot, rows in step.groups:
            if not self.active[slot]:
                continue
            w = self._width[slot]
            a, bt = self.a[slot, :w], self.bt[slot, :w]
            if rows is None:
                out.addmm_(x @ a.t(), bt)
            else:
                out.index_add_(0, rows, (x.index_select(0, rows) @ a.t()) @ bt)
