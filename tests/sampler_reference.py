"""A plain-torch, row-by-row reference of the documented sampling order, for tests only."""
from __future__ import annotations

from collections import Counter

import torch

from common.messages import SamplingParams


def reference_probs(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """One row: raw logits [vocab] -> the probabilities the sampler should draw from."""
    x = logits.double().clone()
    for t in set(prompt) | set(output):
        if p.repetition_penalty != 1.0:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t, count in Counter(output).items():
        x[t] -= count * p.frequency_penalty + p.presence_penalty
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    x = x / p.temperature
    if p.top_k > 0:
        kth = x.sort(descending=True).values[p.top_k - 1]
        x[x < kth] = float("-inf")
    if p.top_p < 1.0:
        probs = x.softmax(-1)
        order = probs.argsort(descending=True)
        kept, mass = [], 0.0
        for t in order.tolist():
            kept.append(t)
            mass += probs[t].item()
            if mass >= p.top_p:
                break
        mask = torch.ones_like(x, dtype=torch.bool)
        mask[kept] = False
        x[mask] = float("-inf")
    probs = x.softmax(-1)
    if p.min_p > 0:
        probs[probs < p.min_p * probs.max()] = 0
        probs = probs / probs.sum()
    return probs.float()
