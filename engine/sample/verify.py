"""Verifying a draft: which of its tokens the model would have produced itself.

Every position of a drafted request is sampled as usual (greedy: the argmax; random: a draw from
that position's distribution), as if the draft before it had been accepted. The draft is accepted
while it equals those samples; the first sample that differs (or, when the whole draft matched,
the sample after it) is the request's next token. For greedy rows that is exactly the greedy
sequence. For random rows it is rejection sampling with a deterministic draft: a draft token d
is kept with probability p(d) (the chance that the sample equals it), and on rejection the
sample is distributed as p without d, renormalised, which is the standard residual
(p - q)+ for q = one-hot(d); so the output keeps the model's distribution.
"""
from __future__ import annotations

import numpy as np


def accept_drafts(samples: list[int], drafts: list[list[int]], num_logits: np.ndarray) -> list[list[int]]:
    """Per request, its accepted draft tokens plus one sampled token.

    samples: one per logits row, requests in order, request i owning num_logits[i] rows
    (1 + len(drafts[i])); drafts: per request, [] when it drafted nothing."""
    accepted, offset = [], 0
    for draft, n in zip(drafts, num_logits.tolist(), strict=True):
        row = samples[offset: offset + n]
        a = 0
        while a < len(draft) and row[a] == draft[a]:
            a += 1
        accepted.append(row[: a + 1])
        offset += n
    return accepted
