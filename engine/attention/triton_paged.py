"""Paged attention in Triton kernels (`triton_kernels.py`): the CUDA platform's backend.

The same cache layout and request order as the torch backend (`torch_paged.py`: one-query rows
first, then the longer chunks, the batch-invariant requests last), so the two are interchangeable
per step and the batch-invariant rows keep the torch backend's fixed-split attention. Per layer:

    store_kv            this step's K/V into their slots
    decode_attention    the one-query rows, split over their keys (Flash-Decoding), GQA groups
                        sharing one K/V read, a fixed number of splits per step
    prefill_attention   the chunks, over their cached prefix and themselves, causal

Metadata is built from the step's device tensors without reading them back (no host sync), and
`decode_metadata` builds the same from fixed-shape buffers for a captured CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import triton_kernels as kernels
from engine.attention.base import StepInputs
from engine.attention.batch_invariant import InvariantRows, batch_invariant_attention
from engine.attention.torch_paged import TorchPagedBackend, batch_parts
from engine.utils import cdiv

# Each split of a decode row's keys holds at least this many (shorter splits cost more in the
# merge than they gain in parallelism), and a step has at most MAX_DECODE_SPLITS.
MIN_SPLIT_KEYS = 256
MAX_DECODE_SPLITS = 32


def decode_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_programs_wanted: int) -> int:
    """Splits per (sequence, KV head): enough programs to fill the device, none needlessly short."""
    wanted = cdiv(num_programs_wanted, max(1, num_seqs * num_kv_heads))
    return max(1, min(wanted, cdiv(max_seq_len, MIN_SPLIT_KEYS), MAX_DECODE_SPLITS))


@dataclass
class PrefillChunks:
    """The step's chunks of more than one query, as the prefill kernel reads them."""

    query_start: torch.Tensor  # [num_chunks] int32: first row in the flat batch
    query_len: torch.Tensor  # [num_chunks] int32
    context_len: torch.Tensor  # [num_chunks] int32: keys in the cache after this step
    block_tables: torch.Tensor  # [num_chunks, width] int32
    max_query_len: int


@dataclass
class TritonPagedMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; negative: a padded row, written nowhere
    num_decodes: int  # the leading rows, one query each
    decode_block_tables: torch.Tensor | None  # [num_decodes, width] int32
    decode_seq_lens: torch.Tensor | None  # [num_decodes] int32
    num_splits: int
    chunks: PrefillChunks | None
    invariant: InvariantRows | None = None  # the batch-invariant tail of the batch


class TritonPagedBackend(TorchPagedBackend):
    name = "triton-paged"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 num_programs_wanted: int = 0):
        super().__init__(num_heads, num_kv_heads, head_dim, block_size, native=None)
        # decode programs that fill the device: two per streaming multiprocessor on CUDA
        if num_programs_wanted <= 0:
            num_programs_wanted = 2 * torch.cuda.get_device_properties(0).multi_processor_count \
                if torch.cuda.is_available() else 8
        self.num_programs_wanted = num_programs_wanted

    def build_metadata(self, inputs: StepInputs) -> TritonPagedMetadata:  # type: ignore[override]
        num_single, num_normal = batch_parts(inputs)
        meta = TritonPagedMetadata(inputs.slot_mapping, num_single, None, None, 1, None)
        if num_single:
            longest = int(inputs.seq_lens_np[:num_single].max())
            meta.decode_block_tables = inputs.block_table[:num_single, : cdiv(longest, self.block_size)]
            meta.decode_seq_lens = inputs.seq_lens[:num_single]
            meta.num_splits = decode_splits(num_single, self.num_kv_heads, longest, self.num_programs_wanted)
        if num_normal > num_single:
            query_start = inputs.query_start_loc[num_single:num_normal + 1]
            meta.chunks = PrefillChunks(
                query_start[:-1], query_start[1:] - query_start[:-1], inputs.seq_lens[num_single:num_normal],
                inputs.block_table[num_single:num_normal],
                int(np.max(inputs.query_lens_np[num_single:num_normal])))
        if num_normal < inputs.num_reqs:
            meta.invariant = self._invariant_rows(inputs, num_normal)
        return meta

    def decode_metadata(self, slot_mapping: torch.Tensor, block_tables: torch.Tensor,  # type: ignore[override]
                        seq_lens: torch.Tensor) -> TritonPagedMetadata:
        """For a captured decode batch: the splits sized for the longest sequence the block table
        can hold, so one graph replays with any lengths (the unused splits are empty)."""
        longest = block_tables.shape[1] * self.block_size
        return TritonPagedMetadata(slot_mapping, len(seq_lens), block_tables, seq_lens,
                                   decode_splits(len(seq_lens), self.num_kv_heads, longest, self.num_programs_wanted),
                                   None)

    def describe_kernel(self, metadata: TritonPagedMetadata, query_start: int) -> str:  # type: ignore[override]
        if metadata.invariant is not None and query_start >= metadata.invariant.row_start:
            return "batch-invariant: each query row alone, its keys in splits of one block"
        if query_start < metadata.num_decodes:
            return (f"triton paged decode over {metadata.num_decodes} sequence"
                    f"{'' if metadata.num_decodes == 1 else 's'}, {metadata.num_splits} key splits, K/V read in place")
        return "triton paged prefill over the cached prefix, causal"

    def native_decode_inputs(self, metadata: object, num_tokens: int) -> None:
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
                kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: TritonPagedMetadata,
                scale: float, kv_written: bool = False) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        if not kv_written:
            kernels.store_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        out = torch.empty_like(q)
        num_decodes = metadata.num_decodes
        if num_decodes:
            assert metadata.decode_block_tables is not None and metadata.decode_seq_lens is not None
            kernels.decode_attention(q[:num_decodes], k_cache, v_cache, metadata.decode_block_tables,
                                     metadata.decode_seq_lens, scale, metadata.num_splits, out[:num_decodes])
        chunks = metadata.chunks
        if chunks is not None:
            kernels.prefill_attention(q, k_cache, v_cache, out, chunks.block_tables, chunks.query_start,
                                      chunks.query_len, chunks.context_len, chunks.max_query_len, scale)
        invariant = metadata.invariant
        if invariant is not None:
            out[invariant.row_start:] = batch_invariant_attention(q[invariant.row_start:], k_cache, v_cache,
                                                                  invariant, scale)
        return out
