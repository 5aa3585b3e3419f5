"""Paged attention over the flat mixed batch in plain torch ops (CPU and CUDA alike).

Cache layout per layer: K and V each [kv_heads, num_blocks, block_size, head_dim], so gathering a
sequence's blocks with `index_select` yields [kv_heads, num_keys, head_dim] contiguously, the
shape attention wants, with no transpose copy (advanced indexing is far slower on CPU).

One-token queries (decodes, and one-token prefill chunks: a query at position p attends to keys
0..p either way) are attended as one batch of small matmuls over [kv_heads * num_seqs] with a
length mask; this backend asks the runner to put them first in the batch. Longer chunks are
attended one sequence at a time (a step holds few, bounded by the token budget) with SDPA: plain
causal attention when the chunk is the whole sequence, a prepared mask when it follows cached
tokens. GQA is handled by grouping query heads per KV head, never by copying K/V per query head.
Requests that ask for batch invariance come last and are attended row by row in fixed key splits
(`batch_invariant.py`).

With `--kv-cache-dtype int8` the rows are int8 codes with a scale each (`kv_int8.py`): quantized as
they are written, de-quantized to the model's dtype as they are gathered (the native decode
kernel de-quantizes in place, a split of keys at a time).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from engine.attention.base import StepInputs
from engine.attention.batch_invariant import InvariantRows, batch_invariant_attention, build_invariant_rows
from engine.attention.kv_int8 import as_model_rows, quantize_rows, row_width
from engine.utils import cdiv


@dataclass
class PrefillChunk:
    """One sequence's chunk of more than one query: rows [query_start, query_start + query_len)."""

    query_start: int
    query_len: int
    context_len: int  # tokens of this sequence in the cache after this step (cached + chunk)
    block_ids: torch.Tensor  # [cdiv(context_len, block_size)] int32, on the device
    # [query_len, context_len] bool, True = may attend; None when the chunk is the whole
    # sequence (nothing cached before it), where plain causal attention applies.
    mask: torch.Tensor | None


@dataclass
class NativePrefill:
    """The step's prompt chunks for the native prefill kernel, all in one call: rows
    [row_start, row_end) of the batch, chunk c owning rows row_start + query_starts[c] ..."""

    row_start: int
    row_end: int
    block_tables: torch.Tensor  # [chunks, max_blocks] int32
    query_starts: torch.Tensor  # [chunks + 1] int32, from 0
    context_lens: torch.Tensor  # [chunks] int32: each chunk's keys in the cache after this step


@dataclass
class TorchPagedMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    num_single_queries: int  # the leading requests, one query row each
    single_block_tables: torch.Tensor | None  # [num_single_queries, max_blocks] int32
    # [kv_heads * num_single_queries, 1, max_blocks * block_size] bool, True past a sequence's end;
    # None where the native kernel attends them (it reads `single_seq_lens` instead)
    single_mask: torch.Tensor | None
    chunks: list[PrefillChunk]
    single_seq_lens: torch.Tensor | None = None  # [num_single_queries] int32
    invariant: InvariantRows | None = None  # the batch-invariant tail of the batch
    native_prefill: NativePrefill | None = None  # set instead of `chunks` where the native kernel attends them


class TorchPagedBackend:
    name = "torch-paged"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 native: ModuleType | None = None, kv_cache_dtype: torch.dtype | None = None):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.block_size = block_size
        # the cache's element type: the model's dtype (or None: the same) or torch.int8 (kv_int8.py's rows)
        self.kv_cache_dtype = kv_cache_dtype
        # The native CPU kernels (engine/native; the engine gives them on CPU only, when they
        # build): the one-query batch with K/V read in place (no gather copy, no padding to the
        # longest sequence), and RoPE fused with the KV write.
        self.native = native
        # and the prompt chunks in one call, K/V read in place (caches in the model's dtype, float32 or
        # bfloat16, not int8; head sizes 64 and 128)
        self.native_prefill = (native is not None and native.prefill_attention_available()
                               and kv_cache_dtype in (None, torch.float32, torch.bfloat16) and head_dim in (64, 128))

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_kv_heads, num_blocks, self.block_size, row_width(self.head_dim, self.kv_cache_dtype))

    def order_requests(self, query_lens: np.ndarray, batch_invariant: np.ndarray | None) -> np.ndarray | None:
        """One-query requests first (stable), so they form one contiguous batch of rows; then the
        longer ones; the batch-invariant ones last, in any order."""
        # sort key: 0 one-query, 1 longer, 2 batch-invariant
        kind = (query_lens != 1).astype(np.int8)
        if batch_invariant is not None:
            kind[batch_invariant] = 2
        if (np.diff(kind) >= 0).all():
            return None  # already in that order
        return np.argsort(kind, kind="stable")

    def build_metadata(self, inputs: StepInputs) -> TorchPagedMetadata:
        num_single, num_normal = batch_parts(inputs)
        bs, device = self.block_size, inputs.positions.device
        meta = TorchPagedMetadata(inputs.slot_mapping, num_single, None, None, [])
        if num_normal < inputs.num_reqs:
            meta.invariant = self._invariant_rows(inputs, num_normal)
        if num_single:
            lens = inputs.seq_lens[:num_single]
            width = cdiv(int(inputs.seq_lens_np[:num_single].max()), bs)
            meta.single_block_tables = inputs.block_table[:num_single, :width]
            if self.native is not None:
                meta.single_seq_lens = lens
            else:
                past_end = torch.arange(width * bs, device=device).unsqueeze(0) >= lens.unsqueeze(1)  # [seqs, keys]
                meta.single_mask = past_end.repeat(self.num_kv_heads, 1).unsqueeze(1)
        qsl = inputs.query_start_loc_np
        if num_normal > num_single and self.native_prefill:
            meta.native_prefill = NativePrefill(
                int(qsl[num_single]), int(qsl[num_normal]), inputs.block_table[num_single:num_normal],
                torch.from_numpy((qsl[num_single:num_normal + 1] - qsl[num_single]).astype(np.int32)),
                inputs.seq_lens[num_single:num_normal])
            return meta
        for i in range(num_single, num_normal):
            start, end = int(inputs.num_computed_tokens_np[i]), int(inputs.seq_lens_np[i])
            mask = None
            if start > 0:  # queries at positions start..end-1 see keys 0..their own position
                q_pos = torch.arange(start, end, device=device).unsqueeze(1)
                mask = torch.arange(end, device=device).unsqueeze(0) <= q_pos  # [query_len, context_len]
            meta.chunks.append(PrefillChunk(int(qsl[i]), end - start, end, inputs.block_table[i, : cdiv(end, bs)],
                                            mask))
        return meta

    def describe_kernel(self, metadata: TorchPagedMetadata, query_start: int) -> str:
        """How the request whose rows start at `query_start` is attended this step (for traces)."""
        invariant = metadata.invariant
        if invariant is not None and query_start >= invariant.row_start:
            return "batch-invariant: each query row alone, its keys in splits of one block"
        num_single = metadata.num_single_queries
        if query_start < num_single and metadata.single_mask is None:
            return (f"one-query batch: native paged decode kernel over {num_single} sequence"
                    f"{'' if num_single == 1 else 's'}, K/V read in place")
        if query_start < num_single:
            assert metadata.single_mask is not None
            return (f"one-query batch: two bmm over {num_single} sequence{'' if num_single == 1 else 's'}, "
                    f"keys padded to {metadata.single_mask.shape[-1]}")
        if metadata.native_prefill is not None:
            return "native prefill kernel over the step's prompt chunks, K/V read in place"
        chunk = next(c for c in metadata.chunks if c.query_start == query_start)
        if chunk.mask is None:
            return "sdpa, causal (the whole sequence in this step)"
        return f"sdpa with a mask (after {chunk.context_len - chunk.query_len} cached tokens)"

    def decode_metadata(self, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor) -> TorchPagedMetadata:
        """A one-query-per-row step from fixed-shape buffers (a padded decode batch, engine/runner/
        decode_graphs.py): every row attends its own keys, masked by seq_lens."""
        meta = TorchPagedMetadata(slot_mapping, len(seq_lens), block_tables, None, [])
        if self.native is not None:
            meta.single_seq_lens = seq_lens
        else:
            keys = block_tables.shape[1] * self.block_size
            past_end = torch.arange(keys, device=seq_lens.device).unsqueeze(0) >= seq_lens.unsqueeze(1)
            meta.single_mask = past_end.repeat(self.num_kv_heads, 1).unsqueeze(1)
        return meta

    def _invariant_rows(self, inputs: StepInputs, first: int) -> InvariantRows:
        """Every row of requests first..num_reqs-1: its position and its request's blocks."""
        qsl, query_lens = inputs.query_start_loc_np, inputs.query_lens_np[first:]
        request_of_row = np.repeat(np.arange(first, inputs.num_reqs), query_lens)
        row_start = int(qsl[first])
        positions = (inputs.num_computed_tokens_np[request_of_row] + np.arange(row_start, inputs.num_tokens)
                     - qsl[request_of_row])
        return build_invariant_rows(row_start, positions, request_of_row, inputs.block_table, self.block_size,
                                    inputs.positions.device)

    def rope_and_write_kv(self, qk: torch.Tensor, v: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                          kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: TorchPagedMetadata,
                          num_heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.native is None:
            return None
        cos, sin = rope  # [num_tokens, 1, head_dim] each, contiguous
        return self.native.rope_write_kv(qk, v, cos, sin, kv_cache[0], kv_cache[1], metadata.slot_mapping, num_heads)

    def native_decode_inputs(self, metadata: TorchPagedMetadata,
                             num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if metadata.single_seq_lens is None or metadata.num_single_queries != num_tokens \
                or metadata.invariant is not None:
            return None
        assert metadata.single_block_tables is not None
        return metadata.slot_mapping, metadata.single_block_tables, metadata.single_seq_lens

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: TorchPagedMetadata,
                scale: float, kv_written: bool = False) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        if not kv_written:
            write_kv(k_cache, v_cache, k, v, metadata.slot_mapping)
        num_single, invariant = metadata.num_single_queries, metadata.invariant
        if num_single == q.shape[0]:
            return self._single_query_attention(q, k_cache, v_cache, metadata, scale)
        if invariant is not None and invariant.row_start == 0:
            return batch_invariant_attention(q, k_cache, v_cache, invariant, scale)
        prefill = metadata.native_prefill
        if prefill is not None and num_single == 0 and invariant is None:
            return self._native_prefill_attention(q, k_cache, v_cache, prefill, scale)
        out = torch.empty_like(q)
        if num_single:
            out[:num_single] = self._single_query_attention(q[:num_single], k_cache, v_cache, metadata, scale)
        if prefill is not None:
            rows = slice(prefill.row_start, prefill.row_end)
            out[rows] = self._native_prefill_attention(q[rows], k_cache, v_cache, prefill, scale)
        for chunk in metadata.chunks:
            rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
            if chunk.mask is None:  # whole sequence in this step: its keys are this step's keys
                kc, vc = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
            else:
                kc = gather_blocks(k_cache, chunk.block_ids, q.dtype)[:, : chunk.context_len]
                vc = gather_blocks(v_cache, chunk.block_ids, q.dtype)[:, : chunk.context_len]
            out[rows] = _chunk_attention(q[rows], kc, vc, chunk.mask, scale)
        if invariant is not None:
            out[invariant.row_start:] = batch_invariant_attention(q[invariant.row_start:], k_cache, v_cache,
                                                                  invariant, scale)
        return out

    def _native_prefill_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  prefill: NativePrefill, scale: float) -> torch.Tensor:
        """The prompt chunks' rows q [rows, heads, head_dim], their K/V already in the cache."""
        assert self.native is not None
        return self.native.paged_prefill_attention(q.contiguous(), k_cache, v_cache, prefill.block_tables,
                                                   prefill.query_starts, prefill.context_lens, scale)

    def _single_query_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                metadata: TorchPagedMetadata, scale: float) -> torch.Tensor:
        """One query per sequence. q: [num_seqs, heads, head_dim]."""
        assert metadata.single_block_tables is not None
        if metadata.single_mask is None:
            assert self.native is not None and metadata.single_seq_lens is not None
            return self.native.paged_decode_attention(q.contiguous(), k_cache, v_cache, metadata.single_block_tables,
                                                      metadata.single_seq_lens, scale)
        num_seqs, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[0]
        group = num_heads // num_kv_heads
        flat_tables = metadata.single_block_tables.flatten()
        # [kv_heads * seqs, keys, head_dim]
        keys = gather_blocks(k_cache, flat_tables, q.dtype).view(num_kv_heads * num_seqs, -1, head_dim)
        values = gather_blocks(v_cache, flat_tables, q.dtype).view(num_kv_heads * num_seqs, -1, head_dim)
        # query heads grouped under their KV head: [kv_heads * num_seqs, group, head_dim]
        qg = q.view(num_seqs, num_kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim)
        scores = torch.bmm(qg, keys.transpose(1, 2)).float() * scale  # [kvh*seqs, group, keys]
        scores.masked_fill_(metadata.single_mask, float("-inf"))
        probs = scores.softmax(dim=-1).to(q.dtype)
        out = torch.bmm(probs, values)  # [kvh*seqs, group, head_dim]
        return out.view(num_kv_heads, num_seqs, group, head_dim).transpose(0, 1).reshape(num_seqs, num_heads, head_dim)


def batch_parts(inputs: StepInputs) -> tuple[int, int]:
    """(num_single, num_normal): requests [0, num_single) have one query row each, [num_single,
    num_normal) longer chunks, [num_normal, num_reqs) ask for batch invariance (order_requests)."""
    query_lens = inputs.query_lens_np
    invariant = inputs.batch_invariant_np
    num_normal = inputs.num_reqs  # the requests before the batch-invariant ones
    if invariant is not None and invariant.any():
        num_normal = int(np.argmax(invariant))
    normal_lens = query_lens[:num_normal]
    num_single = int(np.argmin(normal_lens == 1)) if (normal_lens != 1).any() else num_normal
    assert (normal_lens[num_single:] > 1).all(), "one-query requests must come first (order_requests)"
    return num_single, num_normal


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V ([num_tokens, kv_heads, head_dim]) at their cache slots (an int8
    cache: quantized first)."""
    if k_cache.dtype == torch.int8:
        k, v = quantize_rows(k), quantize_rows(v)
    num_kv_heads, row = k.shape[1], k.shape[2]
    k_cache.view(num_kv_heads, -1, row).index_copy_(1, slot_mapping, k.transpose(0, 1))
    v_cache.view(num_kv_heads, -1, row).index_copy_(1, slot_mapping, v.transpose(0, 1))


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[kv_heads, num_blocks, block_size, row] -> [kv_heads, len(block_ids) * block_size, head_dim] in
    `dtype` (an int8 cache's rows de-quantized)."""
    num_kv_heads, num_blocks, block_size, row = cache.shape
    picked = cache.view(num_kv_heads, num_blocks, block_size * row).index_select(1, block_ids)
    return as_model_rows(picked.view(num_kv_heads, -1, row), dtype)


def _chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """q: [query_len, heads, head_dim]; k, v: [kv_heads, context_len, head_dim]."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                       attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)
