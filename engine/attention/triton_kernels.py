"""The Triton kernels of the CUDA attention backend (`triton_paged.py`), and their launchers.

All three read and write the paged cache in place, in the torch backend's layout (one layer's K,
and its V: [kv_heads, num_blocks, block_size, head_dim], head_dim contiguous), through the block
table; no gather copy, no padding of the keys to the longest sequence.

- `store_kv`: this step's K/V rows into their slots; a negative slot (a padded row of a captured
  decode batch) writes nothing.
- `decode_attention`: one query per sequence, Flash-Decoding: the keys of a sequence are cut into
  `num_splits` equal ranges, one program per (sequence, KV head, split) attends the whole GQA
  group of query heads at once (the group's queries as the rows of one tile, so K and V are read
  once per group), and a second kernel merges the splits by their log-sum-exp. The number of
  splits is a launch constant, so a captured CUDA graph replays with any sequence lengths.
- `prefill_attention`: chunks of several queries over their cached prefix and themselves
  (FlashAttention-style: a tile of queries against tiles of keys with an online softmax; scores
  never materialized), causal by absolute position, one program per (chunk, query tile, head).

On a CPU these run under Triton's interpreter (`TRITON_INTERPRET=1` before triton is imported),
which is how `make test` checks them against the torch backend (float32 and float16; the
interpreter has no bfloat16).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
                     stride_c_head, stride_c_block, stride_c_pos,
                     BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)  # head * stride_c_head can pass 2^31 in a large cache
    slot = tl.load(slot_ptr + tok)
    d = tl.arange(0, HEAD_DIM_PAD)
    mask = (d < HEAD_DIM) & ((d * 0 + slot) >= 0)  # as a vector: the interpreter takes no scalar mask
    slot = tl.maximum(slot, 0)
    dst = head * stride_c_head + (slot // BLOCK_SIZE) * stride_c_block + (slot % BLOCK_SIZE) * stride_c_pos + d
    k = tl.load(k_ptr + tok * stride_k_tok + head * stride_k_head + d, mask=mask)
    v = tl.load(v_ptr + tok * stride_v_tok + head * stride_v_head + d, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


@triton.jit
def _kv_offsets(block_tables_ptr, table_row, n, n_mask, kv_head, d, stride_c_head, stride_c_block, stride_c_pos,
                BLOCK_SIZE: tl.constexpr):
    """[len(n), len(d)] offsets into a cache of keys n (positions in one sequence, whose block
    table row starts at `table_row`), dimensions d, of one KV head."""
    block = tl.load(block_tables_ptr + table_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    return (kv_head * stride_c_head + block[:, None] * stride_c_block + (n % BLOCK_SIZE)[:, None] * stride_c_pos
            + d[None, :])


@triton.jit
def _softmax_tile(q, k_cache_ptr, v_cache_ptr, kv_offsets, kv_mask, visible, m_i, l_i, acc, scale,
                  PRECISION: tl.constexpr):
    """One tile of keys into a running (online) softmax: q [rows, dims] against the tile's K,
    scores masked where not `visible` [rows, keys], the sums so far rescaled to the new maximum,
    V's weighted sum added. Returns (m_i, l_i, acc)."""
    k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [rows, keys]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
                         scale,
                         stride_q_tok, stride_q_head,
                         stride_c_head, stride_c_block, stride_c_pos,
                         stride_bt,
                         stride_po_tok, stride_po_head, stride_po_split,
                         stride_pl_tok, stride_pl_head,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         PRECISION: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)  # kv_head * stride_c_head can pass 2^31 in a large cache
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # equal key ranges, each a whole number of tiles; the last ones may be empty
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for tile_start in range(start, end, BLOCK_N):
        n = tile_start + offs_n
        n_mask = n < end
        kv_offsets = _kv_offsets(block_tables_ptr, seq * stride_bt, n, n_mask, kv_head, d, stride_c_head,
                                 stride_c_block, stride_c_pos, BLOCK_SIZE)
        m_i, l_i, acc = _softmax_tile(q, k_cache_ptr, v_cache_ptr, kv_offsets, n_mask[:, None] & d_mask[None, :],
                                      n_mask[None, :], m_i, l_i, acc, scale, PRECISION)
    nonempty = l_i > 0
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(part_out_ptr + seq * stride_po_tok + heads[:, None] * stride_po_head + split * stride_po_split
             + d[None, :], out, mask=g_mask[:, None] & d_mask[None, :])
    tl.store(part_lse_ptr + seq * stride_pl_tok + heads * stride_pl_head + split, lse, mask=g_mask)


@triton.jit
def _decode_merge_kernel(part_out_ptr, part_lse_ptr, out_ptr,
                         stride_po_tok, stride_po_head, stride_po_split,
                         stride_pl_tok, stride_pl_head,
                         stride_o_tok, stride_o_head,
                         NUM_SPLITS: tl.constexpr, NUM_SPLITS_PAD: tl.constexpr,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    s_mask = s < NUM_SPLITS
    d_mask = d < HEAD_DIM
    lse = tl.load(part_lse_ptr + seq * stride_pl_tok + head * stride_pl_head + s, mask=s_mask, other=float("-inf"))
    weight = tl.exp(lse - tl.max(lse, 0))  # the first split always holds keys: the max is finite
    parts = tl.load(part_out_ptr + seq * stride_po_tok + head * stride_po_head + s[:, None] * stride_po_split
                    + d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(weight[:, None] * parts, 0) / tl.sum(weight, 0)
    tl.store(out_ptr + seq * stride_o_tok + head * stride_o_head + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                    query_start_ptr, query_len_ptr, context_len_ptr,
                    scale,
                    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
                    stride_c_head, stride_c_block, stride_c_pos,
                    stride_bt,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    PRECISION: tl.constexpr):
    chunk = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    head = tl.program_id(2).to(tl.int64)
    query_len = tl.load(query_len_ptr + chunk)
    if tile * BLOCK_M >= query_len:  # the grid covers the longest chunk
        return
    query_start = tl.load(query_start_ptr + chunk)
    context_len = tl.load(context_len_ptr + chunk)  # cached + this chunk
    kv_head = head // GROUP

    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM_PAD)
    m_mask = m < query_len
    d_mask = d < HEAD_DIM
    position = context_len - query_len + m  # each query's absolute position: it sees keys 0..position
    rows = (query_start + m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    # keys up to the tile's last query (rows past the chunk see keys the last row sees)
    end = tl.minimum(context_len, context_len - query_len + (tile + 1) * BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    for tile_start in range(0, end, BLOCK_N):  # key 0 is in the first tile, seen by every row: maxima finite
        n = tile_start + offs_n
        n_mask = n < end
        kv_offsets = _kv_offsets(block_tables_ptr, chunk * stride_bt, n, n_mask, kv_head, d, stride_c_head,
                                 stride_c_block, stride_c_pos, BLOCK_SIZE)
        m_i, l_i, acc = _softmax_tile(q, k_cache_ptr, v_cache_ptr, kv_offsets, n_mask[:, None] & d_mask[None, :],
                                      n_mask[None, :] & (n[None, :] <= position[:, None]), m_i, l_i, acc, scale,
                                      PRECISION)
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_o_tok + head * stride_o_head + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _precision(dtype: torch.dtype) -> str:
    """float32 products in full float32 (TF32 would cost ~1e-3 relative); the 16-bit types as is."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _cache_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    assert cache.dim() == 4 and cache.stride(3) == 1, "cache: [kv_heads, num_blocks, block_size, head_dim]"
    return cache.stride(0), cache.stride(1), cache.stride(2)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [num_tokens, kv_heads, head_dim] (last dim contiguous); slot_mapping: [num_tokens]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(2) == 1 and v.stride(2) == 1
    _store_kv_kernel[(num_tokens, num_kv_heads)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *_cache_strides(k_cache), BLOCK_SIZE=k_cache.shape[2], HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, num_splits: int, out: torch.Tensor,
                     block_n: int = 32) -> None:
    """One query per sequence. q, out: [num_seqs, heads, head_dim]; block_tables: [num_seqs, width]
    int32; seq_lens: [num_seqs] int32, each >= 1. Writes `out`."""
    num_seqs, num_heads, head_dim = q.shape
    if num_seqs == 0:
        return
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    head_dim_pad = triton.next_power_of_2(head_dim)
    assert q.stride(2) == 1 and out.stride(2) == 1 and block_tables.stride(1) == 1
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse, scale,
        q.stride(0), q.stride(1), *_cache_strides(k_cache), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=k_cache.shape[2], BLOCK_N=block_n, NUM_SPLITS=num_splits, PRECISION=_precision(q.dtype))
    _decode_merge_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, NUM_SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)), HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                      block_tables: torch.Tensor, query_start: torch.Tensor, query_len: torch.Tensor,
                      context_len: torch.Tensor, max_query_len: int, scale: float,
                      block_m: int = 64, block_n: int = 64) -> None:
    """Chunks of queries over the cache (their own K/V written first). q, out: [num_tokens,
    heads, head_dim]; per chunk c: rows query_start[c] .. + query_len[c], context_len[c] keys in
    the cache after this step, its blocks in block_tables[c] ([num_chunks, width] int32)."""
    num_chunks = query_len.shape[0]
    if num_chunks == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    assert q.stride(2) == 1 and out.stride(2) == 1 and block_tables.stride(1) == 1
    grid = (num_chunks, triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start, query_len, context_len, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *_cache_strides(k_cache), block_tables.stride(0),
        GROUP=num_heads // k_cache.shape[0], HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[2], BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=_precision(q.dtype))
