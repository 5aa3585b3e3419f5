"""Paged attention over the flat mixed batch, with torch's scaled_dot_product_attention.

Decode tokens (one per sequence) are attended as one batch: each sequence's keys are gathered
from its block table into a [num_decodes, kv_heads, max_blocks * block_size, head_dim] view and
positions past its length are masked. Prefill chunks are attended one sequence at a time (a
step holds few of them, bounded by the token budget), with plain causal attention when the
chunk is the whole sequence and a prepared mask when it follows cached tokens. The same code
runs on CPU and CUDA; GQA is handled by SDPA's enable_gqa, never by copying K/V per head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.forward_context import get_forward_context


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V ([num_tokens, kv_heads, head_dim]) at their cache slots."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int,
                    scale: float) -> torch.Tensor:
    """q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim] (this step's).

    Returns [num_tokens, heads, head_dim].
    """
    ctx = get_forward_context()
    meta = ctx.attn
    k_cache, v_cache = ctx.kv_caches[layer_idx]
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)
    num_decodes = meta.num_decode_tokens
    if num_decodes:
        out[:num_decodes] = _decode_attention(q[:num_decodes], k_cache, v_cache, meta.decode_block_tables,
                                              meta.decode_mask, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
        if chunk.mask is None:  # whole sequence in this step: its keys are this step's keys
            kc, vc = k[rows], v[rows]
        else:
            kc = _gather_blocks(k_cache, chunk.block_ids)[: chunk.context_len]
            vc = _gather_blocks(v_cache, chunk.block_ids)[: chunk.context_len]
        out[rows] = _prefill_attention(q[rows], kc, vc, chunk.mask, scale)
    return out


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[num_blocks_total, block_size, kv_heads, head_dim] -> [len(block_ids) * block_size, kv_heads, head_dim]."""
    return cache[block_ids].flatten(0, 1)


def _prefill_attention(q, k, v, mask, scale):
    # SDPA wants [batch, heads, seq, head_dim]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)


def _decode_attention(q, k_cache, v_cache, block_tables, mask, scale):
    """One query per sequence: two batched matmuls and a softmax, cheaper than SDPA's kernel
    launch for a single query row."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # [num_seqs, max_blocks, block_size, kv_heads, head_dim] -> [num_seqs, kv_heads, max_ctx, head_dim]
    kd = k_cache[block_tables].flatten(1, 2).transpose(1, 2)
    vd = v_cache[block_tables].flatten(1, 2).transpose(1, 2)
    qg = q.view(num_seqs, num_kv_heads, group, head_dim)  # query heads grouped by their KV head
    scores = torch.matmul(qg, kd.transpose(2, 3)).float() * scale  # [num_seqs, kv_heads, group, max_ctx]
    scores.masked_fill_(~mask, float("-inf"))
    probs = scores.softmax(dim=-1).to(q.dtype)
    return torch.matmul(probs, vd).view(num_seqs, num_heads, head_dim)
