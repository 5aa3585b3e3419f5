"""Sampling on the device, in a fixed order:

    raw logits ─▶ penalties (repetition, presence, frequency) ─▶ logit_bias / min_tokens bans
               ─▶ temperature ─▶ top-k ─▶ top-p ─▶ min-p ─▶ sample

Greedy rows (temperature 0) take the argmax after penalties and bias. Random rows draw with the
exponential-race trick (argmax of p / E, E ~ Exp(1)), which equals sampling from p; a seeded
row draws its noise from its own generator, so its tokens do not depend on the batch it is in.
Logprobs are those of the raw model distribution (before any processing), like vLLM's default.
The only host sync is reading the sampled ids (and the logprobs, when asked).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from common.messages import TokenLogprob
from engine.sampling_batch import SamplingBatch


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[list[TokenLogprob] | None]


def apply_penalties(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    if b.repetition_penalty is not None:
        seen = b.prompt_mask | (b.output_counts > 0)
        penalised = torch.where(logits > 0, logits / b.repetition_penalty, logits * b.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if b.frequency_penalty is not None:
        logits = logits - b.frequency_penalty * b.output_counts
    if b.presence_penalty is not None:
        logits = logits - b.presence_penalty * (b.output_counts > 0).float()
    if b.bias is not None:
        logits = logits + b.bias
    return logits


def compute_probs(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Processed logits [num_seqs, vocab] -> the distribution random rows sample from."""
    temp = torch.where(b.temperature > 0, b.temperature, torch.ones_like(b.temperature))
    logits = logits / temp.unsqueeze(1)
    if b.top_k is not None or b.top_p is not None:
        logits = _top_k_top_p(logits, b.top_k, b.top_p)
    probs = logits.softmax(dim=-1)
    if b.min_p is not None:
        keep = probs >= b.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    if top_k is not None:
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the better-ranked tokens
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


class Sampler:
    def __init__(self, default_generator: torch.Generator):
        self.default_generator = default_generator

    def __call__(self, logits: torch.Tensor, b: SamplingBatch) -> SamplerOutput:
        """logits: [num_seqs, vocab] float32."""
        raw_logprobs = logits.log_softmax(dim=-1) if b.max_num_logprobs >= 0 else None
        logits = apply_penalties(logits, b)
        if b.all_greedy:
            sampled = logits.argmax(dim=-1)
        else:
            probs = compute_probs(logits, b)
            noise = self._exponential_noise(probs, b.generators)
            drawn = (probs / noise).argmax(dim=-1)
            sampled = torch.where(b.temperature > 0, drawn, logits.argmax(dim=-1))
        token_ids = sampled.tolist()
        logprobs = self._logprobs(raw_logprobs, sampled, token_ids, b) if raw_logprobs is not None else [None] * len(token_ids)
        return SamplerOutput(token_ids, logprobs)

    def _exponential_noise(self, probs: torch.Tensor, generators: list) -> torch.Tensor:
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.default_generator)
        for i, g in enumerate(generators):
            if g is not None:
                noise[i].exponential_(generator=g)
        return noise

    @staticmethod
    def _logprobs(raw: torch.Tensor, sampled: torch.Tensor, token_ids: list[int], b: SamplingBatch) -> list:
        chosen = raw.gather(1, sampled.unsqueeze(1)).squeeze(1).tolist()
        k = max(b.max_num_logprobs, 0)
        top_vals, top_ids = raw.topk(k, dim=-1) if k else (None, None)
        top_vals = top_vals.tolist() if k else None
        top_ids = top_ids.tolist() if k else None
        out = []
        for i, n in enumerate(b.num_logprobs):
            if n is None:
                out.append(None)
                continue
            entry = [TokenLogprob(token_ids[i], chosen[i])]
            if n:
                entry += [TokenLogprob(t, v) for t, v in zip(top_ids[i][:n], top_vals[i][:n])]
            out.append(entry)
        return out
