"""Applying a step's grammar bitmask to the logits: disallowed tokens become -inf.

Before penalties, temperature and the filters (the sampler's first step), so greedy rows take
the best allowed token and random rows draw from the allowed ones only. Rows without a grammar
are not touched. xgrammar's kernel does the unpacking (C++ on the CPU, Triton or CUDA on a GPU).
"""
from __future__ import annotations

import torch

from engine.structured.manager import GrammarBitmask


def apply_grammar_bitmask(logits: torch.Tensor, grammar: GrammarBitmask, logits_row_of: dict[str, int]) -> None:
    """logits: [num_logits, vocab] float32, in place; logits_row_of: request id -> its row."""
    import xgrammar as xgr  # here: an engine that never sees a grammar never loads it

    rows = [logits_row_of[r] for r in grammar.request_ids]
    bitmask = grammar.bitmask.to(logits.device, non_blocking=True)
    vocab_size = min(logits.shape[-1], bitmask.shape[-1] * 32)
    if rows == list(range(len(rows))):  # the constrained rows lead: a view, no copies
        xgr.apply_token_bitmask_inplace(logits[: len(rows)], bitmask, vocab_size=vocab_size)
        return
    index = torch.tensor(rows, device=logits.device)
    part = logits.index_select(0, index)
    xgr.apply_token_bitmask_inplace(part, bitmask, vocab_size=vocab_size)
    logits.index_copy_(0, index, part)
