"""Paged attention over the flat mixed batch, in plain torch ops (CPU and CUDA alike).

Cache layout per layer: K and V each [kv_heads, num_blocks, block_size, head_dim], so gathering a
sequence's blocks with `index_select` yields [kv_heads, num_keys, head_dim] contiguously, the
shape attention wants, with no transpose copy (advanced indexing is ~10x slower on CPU here).

Decode tokens (one per sequence) are attended as one batch of small matmuls over
[kv_heads * num_seqs] with a length mask. Prefill chunks are attended one sequence at a time (a
step holds few of them, bounded by the token budget) with SDPA: plain causal attention when the
chunk is the whole sequence, a prepared mask when it follows cached tokens. GQA is handled by
grouping query heads per KV head, never by copying K/V per query head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.forward_context import get_forward_context


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V ([num_tokens, kv_heads, head_dim]) at their cache slots."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, k.transpose(0, 1))
    v_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, v.transpose(0, 1))


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[kv_heads, num_blocks, block_size, head_dim] -> [kv_heads, len(block_ids) * block_size, head_dim]."""
    num_kv_heads, num_blocks, block_size, head_dim = cache.shape
    picked = cache.view(num_kv_heads, num_blocks, block_size * head_dim).index_select(1, block_ids)
    return picked.view(num_kv_heads, -1, head_dim)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int,
                    scale: float) -> torch.Tensor:
    """q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim] (this step's).

    Returns [num_tokens, heads, head_dim].
    """
    ctx = get_forward_context()
    meta = ctx.attn
    k_cache, v_cache = ctx.kv_caches[layer_idx]
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    num_decodes = meta.num_decode_tokens
    if num_decodes == q.shape[0]:
        return _decode_attention(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_mask, scale)
    out = torch.empty_like(q)
    if num_decodes:
        out[:num_decodes] = _decode_attention(q[:num_decodes], k_cache, v_cache, meta.decode_block_tables,
                                              meta.decode_mask, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
        if chunk.mask is None:  # whole sequence in this step: its keys are this step's keys
            kc, vc = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            kc = gather_blocks(k_cache, chunk.block_ids)[:, : chunk.context_len]
            vc = gather_blocks(v_cache, chunk.block_ids)[:, : chunk.context_len]
        out[rows] = _prefill_attention(q[rows], kc, vc, chunk.mask, scale)
    return out


def _prefill_attention(q, k, v, mask, scale):
    """q: [query_len, heads, head_dim]; k, v: [kv_heads, context_len, head_dim]."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                       attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)


def _decode_attention(q, k_cache, v_cache, block_tables, mask, scale):
    """One query per sequence. q: [num_seqs, heads, head_dim]; block_tables: [num_seqs, max_blocks];
    mask: [kv_heads * num_seqs, 1, max_blocks * block_size], True where there is no key."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    flat_tables = block_tables.flatten()
    keys = gather_blocks(k_cache, flat_tables).view(num_kv_heads * num_seqs, -1, head_dim)  # [kvh*seqs, keys, hd]
    values = gather_blocks(v_cache, flat_tables).view(num_kv_heads * num_seqs, -1, head_dim)
    # query heads grouped under their KV head: [kv_heads * num_seqs, group, head_dim]
    qg = q.view(num_seqs, num_kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim)
    scores = torch.bmm(qg, keys.transpose(1, 2)).float() * scale  # [kvh*seqs, group, keys]
    scores.masked_fill_(mask, float("-inf"))
    probs = scores.softmax(dim=-1).to(q.dtype)
    out = torch.bmm(probs, values)  # [kvh*seqs, group, head_dim]
    return out.view(num_kv_heads, num_seqs, group, head_dim).transpose(0, 1).reshape(num_seqs, num_heads, head_dim)
