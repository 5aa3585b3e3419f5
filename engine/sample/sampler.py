"""Sampling on the device, in a fixed order:

    raw logits ─▶ penalties (repetition, presence, frequency) ─▶ logit_bias / min_tokens bans
               ─▶ temperature ─▶ top-k ─▶ top-p ─▶ min-p ─▶ draw

Greedy rows (temperature 0) take the argmax after penalties and bias and skip everything else;
only rows that use a step are touched by it. Random rows are drawn as `filters.py` describes.
Logprobs are those of the raw model distribution (before any processing), like vLLM's default,
ranked with the same tie rule as the argmax (lower id first), so without penalties or bias the
greedy token is always the first entry. On CUDA the only host reads are the sampled ids (and the
logprobs, when asked); on CPU a few small reads pick cheaper paths (see `filters.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.sample.filters import apply_top_k, draw, top_tokens
from engine.sample.state import SamplingMetadata, SamplingState


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [rows] int64, on the device
    # [rows, 1 + max_num_logprobs]: the sampled token, then the best k; None when nobody asked
    logprob_token_ids: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata, state: SamplingState) -> torch.Tensor:
    """Penalties and bias on the rows that use them, in place. logits: [rows, vocab] float32.

    The repetition penalty scales the logits of seen tokens; presence, frequency and logit_bias
    (and the min_tokens ban) are one running additive row per request (see `state.py`)."""
    if md.repetition_idx is not None:
        assert md.repetition_rows is not None and md.repetition_penalty is not None and state.seen is not None
        x = logits.index_select(0, md.repetition_idx)
        seen = state.seen.index_select(0, md.repetition_rows)
        penalty = md.repetition_penalty
        logits.index_copy_(0, md.repetition_idx, torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x))
    if md.additive_row_range is not None:
        assert state.additive is not None
        logits.add_(state.additive[md.additive_row_range])
    elif md.additive_idx is not None:
        assert md.additive_rows is not None and state.additive is not None
        logits.index_add_(0, md.additive_idx, state.additive.index_select(0, md.additive_rows))
    return logits


class Sampler:
    def __init__(self, default_generator: torch.Generator, native: Any = None):
        self.default_generator = default_generator
        # the native CPU kernels' module (engine/native): each draw's passes over the vocabulary
        self.native = native

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata, state: SamplingState) -> SamplerOutput:
        """logits: [rows, vocab] float32 (modified in place)."""
        raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs >= 0 else None
        logits = apply_penalties(logits, md, state)
        if md.all_greedy:
            sampled = self._argmax(logits)
        elif md.random_idx is None:  # every row random
            sampled = self._draw(logits, md)
        else:
            assert md.greedy_idx is not None
            sampled = torch.empty(md.num_rows, dtype=torch.int64, device=logits.device)
            sampled[md.greedy_idx] = self._argmax(logits.index_select(0, md.greedy_idx))
            sampled[md.random_idx] = self._draw(logits.index_select(0, md.random_idx), md)
        out = SamplerOutput(sampled)
        if raw_logprobs is not None:
            out.logprob_token_ids, out.logprobs = _ranked_logprobs(raw_logprobs, sampled, md.max_num_logprobs)
        return out

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """torch.argmax over the vocabulary: [rows] int64 (the native kernel's rows run in parallel)."""
        if self.native is not None and logits.is_cpu and logits.dtype == torch.float32:
            return self.native.argmax_rows(logits)
        return logits.argmax(dim=-1)

    def _draw(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """logits: [num_random, vocab] of the random rows only."""
        assert md.temperature is not None
        x = logits.div_(md.temperature)
        if md.top_k is not None:
            x = apply_top_k(x, md.top_k, md.max_top_k)
        return draw(x.softmax(dim=-1), md.top_p, md.min_p, md.generators, self.default_generator, self.native)


def _ranked_logprobs(raw: torch.Tensor, sampled: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, 1 + k] ids and logprobs: the sampled token, then the k best (ties: lower id first)."""
    chosen = raw.gather(1, sampled.unsqueeze(1))
    if not k:
        return sampled.unsqueeze(1), chosen
    vals, ids = top_tokens(raw, k)
    return torch.cat((sampled.unsqueeze(1), ids), 1), torch.cat((chosen, vals), 1)
