"""Decode steps at fixed, padded batch sizes from static input buffers: CUDA graphs.

A small model's decode step on a GPU is bound by launching its hundreds of kernels, not by the
chip. So, as vLLM does, the decode forward is captured once per padded batch size (1, 2, 4, 8,
then steps of 8 up to max_num_seqs) into a CUDA graph that reads its inputs from static buffers:
token ids, positions, slot mapping, the block table at full width (max_model_len) and the
sequence lengths. A decode step of n rows is copied into the buffers, padded to the next size,
and replayed; the padded rows decode token 0 at position 0 over one key, in a block the block
manager never hands out (`pad_block`: the KV cache holds one block more), so they write nothing
that a real row reads. Steps with prefill chunks, drafts, batch-invariant or traced requests, or
more rows than the largest size, run eagerly.

On a CPU nothing is captured: `run` is then an eager call with the same padded inputs, which is
how the tests check the padding against the unpadded step.
"""
from __future__ import annotations

import bisect
import logging

import torch

from engine.attention.base import AttentionBackend
from engine.attention.forward_context import ForwardContext, forward_context
from engine.models.llama import CausalLM
from engine.utils import cdiv

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8, up to and including max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if not sizes or sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_size(num_rows: int, sizes: list[int]) -> int | None:
    """The smallest size that holds num_rows (sizes ascending), or None past the largest."""
    i = bisect.bisect_left(sizes, num_rows)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphs:
    def __init__(self, model: CausalLM, backend: AttentionBackend, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 sizes: list[int], max_model_len: int, block_size: int, pad_block: int, device: torch.device):
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.sizes = sizes
        self.block_size = block_size
        self.pad_block = pad_block
        self.device = device
        rows, width = sizes[-1], cdiv(max_model_len, block_size)
        self.input_ids = torch.zeros(rows, dtype=torch.int32, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), pad_block * block_size, dtype=torch.int64, device=device)
        # columns past a row's blocks: stale but valid block ids, masked by seq_lens
        self.block_tables = torch.full((rows, width), pad_block, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # per captured size: its hidden states [size, hidden]

    def takes(self, num_tokens: int, num_reqs: int, eager_only: bool) -> bool:
        """A decode-only step (one row per request) that fits: `eager_only` for the steps that must
        not replay (batch-invariant, traced)."""
        return not eager_only and num_tokens == num_reqs and num_tokens <= self.sizes[-1]

    def capture(self) -> None:
        """Capture every size, largest first, the smaller ones sharing the largest's memory pool."""
        pool = None
        for size in reversed(self.sizes):
            self._forward(size)  # compiles the kernels and settles the allocator before capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """One decode row per sequence ([n] each; block_table [n, width]): hidden states [n, hidden]."""
        n, width = len(input_ids), block_table.shape[1]
        size = padded_size(n, self.sizes)
        assert size is not None, f"{n} rows, more than the largest size {self.sizes[-1]}"
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        self.block_tables[:n, :width].copy_(block_table)
        self.seq_lens[:n].copy_(seq_lens)
        if n < size:  # the padded rows: token 0 at position 0, its one key in the pad block
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.slot_mapping[n:size].fill_(self.pad_block * self.block_size)
            self.block_tables[n:size].fill_(self.pad_block)
            self.seq_lens[n:size].fill_(1)
        graph = self.graphs.get(size)
        if graph is None:  # not captured (a CPU): the same padded inputs, eagerly
            return self._forward(size)[:n]
        graph.replay()
        return self.outputs[size][:n]

    def _forward(self, size: int) -> torch.Tensor:
        metadata = self.backend.decode_metadata(self.slot_mapping[:size], self.block_tables[:size],
                                                self.seq_lens[:size])
        with forward_context(ForwardContext(self.backend, metadata, self.kv_caches)):
            return self.model(self.input_ids[:size], self.positions[:size])

    def describe(self) -> str:
        kind = "CUDA graphs captured" if self.graphs else "padded eager steps"
        return f"{kind} for decode batches of {', '.join(map(str, self.sizes))} rows"
