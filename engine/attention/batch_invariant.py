"""Batch-invariant paged attention: each query row's output bitwise independent of the batch.

The torch backend's fast paths sum over a padded key length that depends on the longest
sequence in the step (decode) or over a chunk of queries at once (prefill), so the order of a
row's floating-point sums, and with it its low bits, depends on what else is in the step. Here
every query row, prefill or decode alike, is attended on its own, over its keys in fixed-size
splits of one KV block, combined in a fixed order:

    per (row, kv head, block b):  s_b = q_g @ K_b^T        [group, block_size]  one fixed-shape bmm
    per row:                      M = max over its keys of s
    per block:                    [p_b, 1/Z_b] = softmax([s_b, M]),  Z_b = 1 + sum exp(s_b - M)
                                  o_b = p_b @ V_b          [group, head_dim]    one fixed-shape bmm
                                  out = tree_sum(o_b * Z_b) / tree_sum(sum(p_b) * Z_b)

A bmm of fixed per-matrix shapes computes each matrix the same way whatever the batch count, a
max is exact, softmax and a sum over the last dimension of a fixed size are the same per row,
division is exact in every code path, and the tree
over blocks (`_tree_sum`) pairs blocks the same way whatever the padding, adding a block only when
it exists for that row. So a row's result depends on its query, its position and its own K/V only:
not on the other rows, their lengths, the chunk it was prefilled in, or whether it is a decode.
Cost: a prefill row gathers its own blocks (no sharing between the rows of a chunk), so a prompt
of L tokens gathers about L^2 / (2 * block_size) blocks per layer; rows are taken in groups that
bound that memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.kv_int8 import as_model_rows

# Rows x blocks gathered at once (K and V of all KV heads): 4096 x 16 keys x 3 heads x 64 dims x
# 2 bytes x 2 is 50 MB for SmolLM2 in bfloat16.
MAX_ROW_BLOCKS_PER_GROUP = 4096


@dataclass
class InvariantRows:
    """The batch-invariant query rows of a step: rows [row_start, num_tokens) of the flat batch."""

    row_start: int
    block_tables: torch.Tensor  # [rows, width] int32: each row's sequence's blocks
    past_end: torch.Tensor  # [rows, width, block_size] bool: True for keys after the row's position
    # The combining tree over a power of two >= width, one mask per level (halves 1, 2, 4, ...):
    # [rows, half] bool, True where element i + half exists for the row (holds keys it sees)
    tree_levels: list[torch.Tensor]
    groups: list[slice]  # rows attended together (bounded gather memory)


def build_invariant_rows(row_start: int, positions_np: np.ndarray, request_of_row: np.ndarray,
                         block_table: torch.Tensor, block_size: int, device: torch.device) -> InvariantRows:
    """positions_np: [rows] position of each invariant row; request_of_row: [rows] its request's
    index into block_table ([num_reqs, width] int32, device). Built once per step, shared by the
    layers."""
    num_blocks_np = positions_np // block_size + 1
    width = int(num_blocks_np.max())
    rows_per_group = max(1, MAX_ROW_BLOCKS_PER_GROUP // width)
    groups = [slice(i, min(i + rows_per_group, len(positions_np))) for i in range(0, len(positions_np), rows_per_group)]
    tables = block_table[:, :width].index_select(0, torch.from_numpy(request_of_row).to(device))
    positions = torch.from_numpy(positions_np).to(device)
    keys = torch.arange(width * block_size, device=device).view(1, width, block_size)
    num_blocks = torch.from_numpy(num_blocks_np).to(device).unsqueeze(1)
    size = 1 << (width - 1).bit_length()
    levels = []
    while size > 1:
        size //= 2
        levels.append(torch.arange(size, 2 * size, device=device).unsqueeze(0) < num_blocks)
    return InvariantRows(row_start, tables, keys > positions.view(-1, 1, 1), levels, groups)


def batch_invariant_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: InvariantRows,
                              scale: float) -> torch.Tensor:
    """q: [rows, heads, head_dim] (the invariant rows, their K/V already in the cache); caches
    [kv_heads, num_blocks, block_size, row] (row: head_dim, or head_dim + 4 for int8). Returns
    [rows, heads, head_dim]."""
    if len(rows.groups) == 1:
        return _attend(q, k_cache, v_cache, rows.block_tables, rows.past_end, rows.tree_levels, scale)
    out = torch.empty_like(q)
    for group in rows.groups:
        out[group] = _attend(q[group], k_cache, v_cache, rows.block_tables[group], rows.past_end[group],
                             [level[group] for level in rows.tree_levels], scale)
    return out


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
            past_end: torch.Tensor, tree_levels: list[torch.Tensor], scale: float) -> torch.Tensor:
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads, total_blocks, block_size, row = k_cache.shape  # row: head_dim (+ 4 for int8)
    group = num_heads // num_kv_heads
    width = tables.shape[1]
    flat = tables.flatten()
    # [kv_heads * rows * width, block_size, head_dim]: each row's own blocks, one matrix per block
    # (an int8 cache's rows de-quantized, kv_int8.py)
    def blocks(cache: torch.Tensor) -> torch.Tensor:
        picked = cache.view(num_kv_heads, total_blocks, -1).index_select(1, flat).view(-1, block_size, row)
        return as_model_rows(picked, q.dtype)

    keys, values = blocks(k_cache), blocks(v_cache)
    # queries grouped under their KV head, once per block: [kv_heads * rows * width, group, head_dim]
    qg = q.view(num_rows, num_kv_heads, group, head_dim).transpose(0, 1).unsqueeze(2)
    qb = qg.expand(num_kv_heads, num_rows, width, group, head_dim).reshape(-1, group, head_dim)
    scores = torch.bmm(qb, keys.transpose(1, 2)).float().mul_(scale)
    scores = scores.view(num_kv_heads, num_rows, width, group, block_size)
    scores.masked_fill_(past_end.view(1, num_rows, width, 1, block_size), float("-inf"))
    # Each block's keys with the row's maximum M appended: softmax gives exp(s - M) / Z_b for the
    # keys and 1 / Z_b for the anchor, with Z_b = 1 + sum exp(s - M). (An elementwise exp could
    # round an element differently where it falls in the vectorized body or the scalar tail of
    # the loop, which depends on the tensor's size; softmax applies one exp to every row alike.)
    row_max = scores.amax(dim=(2, 4), keepdim=True).expand(num_kv_heads, num_rows, width, group, 1)
    probs = torch.cat((scores, row_max), dim=-1).softmax(dim=-1)
    inv_z = probs[..., block_size:]  # [kv_heads, rows, width, group, 1]
    weights = probs[..., :block_size]
    block_out = torch.bmm(weights.reshape(-1, group, block_size).to(q.dtype), values).float()
    # per block [sum exp(s - M) * v, sum exp(s - M)]: [kv_heads, rows, width, group, head_dim + 1]
    partial = torch.cat((block_out.view(num_kv_heads, num_rows, width, group, head_dim),
                         weights.sum(dim=-1, keepdim=True)), dim=-1).div_(inv_z)
    total = _tree_sum(partial, tree_levels)
    o = total[..., :head_dim] / total[..., head_dim:]  # [kv_heads, rows, group, head_dim]
    return o.transpose(0, 1).reshape(num_rows, num_heads, head_dim).to(q.dtype)


def _tree_sum(x: torch.Tensor, levels: list[torch.Tensor]) -> torch.Tensor:
    """Sum over dim 2 of x ([kv_heads, rows, width, ...]) in a fixed binary tree: at each level
    element i takes i + half, only where that element exists for the row (`levels`, widest
    first), so padding (to a power of two, or a wider batch) never changes a row's sums."""
    width = x.shape[2]
    size = 2 * levels[0].shape[1] if levels else 1
    if size > width:
        x = torch.cat((x, x.new_zeros(*x.shape[:2], size - width, *x.shape[3:])), dim=2)
    trailing = (1,) * (x.dim() - 3)
    for exists in levels:
        half = exists.shape[1]
        left = x[:, :, :half]
        x = torch.where(exists.view(1, *exists.shape, *trailing), left + x[:, :, half:2 * half], left)
    return x[:, :, 0]
