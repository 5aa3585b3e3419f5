"""The sampler's filters and draws, exact and cheap on a [rows, vocab] batch.

Ties are broken one way everywhere: among equal values the lower token id ranks first (argmax,
top-k, top-p, the logprob ranking), so `top_k=1` or a tiny `top_p` picks exactly the greedy token.

Drawing: one uniform number per row and the inverse of the cumulative distribution (no noise over
the whole vocabulary). Top-p and min-p are applied by rejection: draw from the distribution after
top-k, keep the token if it lies inside the nucleus (the probability of the tokens ranked before
it is below top_p) and above min_p x the top probability, else draw again. An accepted draw is
distributed exactly as the truncated distribution, without sorting the vocabulary; a row still
rejected after a few rounds (a tiny nucleus) is drawn from the exact truncated distribution,
which sorts only that row. On CUDA, where a sort of the batch is cheap and the rejection loop's
data-dependent host reads are not, the exact truncated distribution is built directly. A seeded
row draws only from its own generator, so its tokens do not depend on the batch it is in.
"""
from __future__ import annotations

from typing import Any

import torch

REJECTION_ROUNDS = 3


def apply_top_k(x: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep each row's top_k largest entries (ties: lower ids first), -inf elsewhere, in place.

    x: [rows, vocab]; top_k: [rows] int64, >= vocab_size where off."""
    vocab = x.shape[-1]
    k = top_k.clamp(max=max_top_k)
    kth = x.topk(max_top_k, dim=-1).values.gather(1, (k - 1).unsqueeze(1))  # [rows, 1]
    kth = kth.masked_fill((top_k >= vocab).unsqueeze(1), float("-inf"))
    keep = x >= kth
    num_kept = keep.sum(-1)
    wanted = torch.where(top_k >= vocab, num_kept, k)
    # Ties at the k-th value: keep the lowest ids of them. (Always on CUDA: the check is a host read.)
    if x.is_cuda or not bool((num_kept == wanted).all()):
        above = x > kth
        tied = keep & ~above
        need = (wanted - above.sum(-1)).unsqueeze(1)
        keep = above | (tied & (tied.cumsum(-1) <= need))
    return x.masked_fill_(~keep, float("-inf"))


def nucleus_probs(probs: torch.Tensor, top_p: torch.Tensor | None, min_p: torch.Tensor | None) -> torch.Tensor:
    """The exact top-p then min-p distribution by a full (stable) sort: the reference the
    rejection draw must agree with, and its fallback. probs: [rows, vocab] summing to 1."""
    if top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the better-ranked tokens
        drop = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill(drop, 0.0))
    if min_p is not None:
        probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def compute_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None, max_top_k: int,
                  top_p: torch.Tensor | None, min_p: torch.Tensor | None) -> torch.Tensor:
    """Processed logits [rows, vocab] (all rows random) -> the exact distribution they sample from:
    temperature -> top-k -> top-p -> min-p."""
    x = logits / temperature
    if top_k is not None:
        x = apply_top_k(x, top_k, max_top_k)
    return nucleus_probs(x.softmax(dim=-1), top_p, min_p)


def draw(probs: torch.Tensor, top_p: torch.Tensor | None, min_p: torch.Tensor | None,
         generators: list[tuple[int, torch.Generator]], default_generator: torch.Generator,
         native: Any = None) -> torch.Tensor:
    """One token per row from `probs` [rows, vocab] (after temperature and top-k) truncated by
    top-p and min-p. Returns [rows] int64. `native`: the native CPU kernels' module, whose
    inverse_cdf and nucleus_ok make each round's two passes over the vocabulary one call each
    (engine/native/csrc/sample_draw.cpp); the same uniforms are drawn either way."""
    rows, vocab = probs.shape
    if native is None or probs.is_cuda or probs.dtype != torch.float32:
        inverse_cdf, inside = _inverse_cdf, _inside
    else:
        inverse_cdf, inside = native.inverse_cdf, native.nucleus_ok
    if probs.is_cuda and (top_p is not None or min_p is not None):
        probs = nucleus_probs(probs, top_p, min_p)
        top_p = min_p = None
    pending = torch.arange(rows, device=probs.device)
    sampled = torch.empty(rows, dtype=torch.int64, device=probs.device)
    top_prob = probs.amax(dim=-1) if min_p is not None else None
    for _ in range(REJECTION_ROUNDS):
        first = len(pending) == rows
        p = probs if first else probs[pending]
        token = inverse_cdf(p, _uniform(None if first else pending, rows, generators, default_generator, probs.device))
        if top_p is None and min_p is None:
            return token
        ok = inside(p, token, None if top_p is None else top_p[pending],
                    None if min_p is None else min_p[pending], None if top_prob is None else top_prob[pending])
        sampled[pending[ok]] = token[ok]
        pending = pending[~ok]
        if not len(pending):
            return sampled
    exact = nucleus_probs(probs[pending], None if top_p is None else top_p[pending],
                          None if min_p is None else min_p[pending])
    sampled[pending] = inverse_cdf(exact, _uniform(pending, rows, generators, default_generator, probs.device))
    return sampled


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the token whose slice of the cumulative distribution holds u x total ([rows] int64).

    In two levels, since a cumulative sum over the vocabulary is a slow sequential scan: block
    sums, their cumulative sum and a search pick the block; a cumulative sum over that block only
    picks the token. `right=True` searches never land on a zero-probability block or token (its
    slice is empty), and the target is kept inside the chosen block's own sum."""
    rows, vocab = probs.shape
    block = next((b for b in (256, 128, 64, 32, 16) if vocab % b == 0), vocab)
    blocks = probs.view(rows, vocab // block, block)
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # [rows, num_blocks]
    target = (u * block_cdf[:, -1]).unsqueeze(1)  # [rows, 1]
    b = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)  # [rows, 1]
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), 0.0)
    inner_cdf = blocks.gather(1, b.unsqueeze(2).expand(rows, 1, block)).squeeze(1).cumsum(dim=-1)  # [rows, block]
    inner_target = torch.minimum((target - before).clamp(min=0.0), inner_cdf[:, -1:] * (1 - 2.0**-20))
    j = torch.searchsorted(inner_cdf, inner_target, right=True).clamp_(max=block - 1)
    return (b * block + j).squeeze(1)


def _inside(probs: torch.Tensor, token: torch.Tensor, top_p: torch.Tensor | None, min_p: torch.Tensor | None,
            top_prob: torch.Tensor | None) -> torch.Tensor:
    """Whether each drawn token survives top-p and min-p. probs: [rows, vocab]; token: [rows]."""
    p_token = probs.gather(1, token.unsqueeze(1))  # [rows, 1]
    ok = torch.ones(len(token), dtype=torch.bool, device=probs.device)
    if top_p is not None:
        ok &= (_mass_ranked_before(probs, token, p_token) < top_p) | (top_p >= 1)
    if min_p is not None:
        assert top_prob is not None
        ok &= p_token.squeeze(1) >= min_p * top_prob
    return ok


def _mass_ranked_before(probs: torch.Tensor, token: torch.Tensor, p_token: torch.Tensor) -> torch.Tensor:
    """Per row, the probability of the tokens ranked before `token` (higher probability, or equal
    with a lower id). [rows] float32.

    By arithmetic rather than comparisons (which are several times slower on a CPU): with
    d = p - p_token, sign(d) counts the tokens above and below, relu(d) sums how far above they
    are. Ties with p_token (rare: only the rows that have them) are counted by id exactly."""
    vocab = probs.shape[1]
    d = probs - p_token  # [rows, vocab]
    sign = torch.sign(d)
    num_unequal = sign.abs().sum(dim=-1)  # tokens above + below
    num_above = (sign.sum(dim=-1) + num_unequal) / 2
    mass = d.clamp_(min=0.0).sum(dim=-1) + p_token.squeeze(1) * num_above
    tied = torch.nonzero(num_unequal < vocab - 1).squeeze(1)  # another token has p_token exactly
    if len(tied):
        ids = torch.arange(vocab, device=probs.device)
        lower = (probs[tied] == p_token[tied]) & (ids < token[tied].unsqueeze(1))
        mass[tied] += p_token[tied].squeeze(1) * lower.sum(dim=-1)
    return mass


def _uniform(pending: torch.Tensor | None, rows: int, generators: list[tuple[int, torch.Generator]],
             default_generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """One uniform in [0, 1) per pending row (None: every row); a seeded row's comes from its own
    generator."""
    u = torch.rand(rows if pending is None else len(pending), generator=default_generator, device=device)
    if generators:
        where = {r: r for r in range(rows)} if pending is None else {int(r): i for i, r in enumerate(pending.tolist())}
        for row, gen in generators:
            i = where.get(row)
            if i is not None:
                u[i] = torch.rand(1, generator=gen, device=device)
    return u


def top_tokens(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best entries of each row, best first, ties by lower id: (values, ids), each [rows, k]."""
    vals = logprobs.topk(k, dim=-1).values
    kth = vals[:, -1:]
    candidates = logprobs >= kth
    if bool((candidates.sum(-1) == k).all()):
        # the set is right; order it by value, then id (a stable sort over ascending ids)
        ids = candidates.nonzero()[:, 1].view(-1, k)
        picked = logprobs.gather(1, ids)
        order = picked.sort(dim=-1, descending=True, stable=True).indices
        return picked.gather(1, order), ids.gather(1, order)
    sorted_vals, order = logprobs.sort(dim=-1, descending=True, stable=True)  # rare: ties at the k-th value
    return sorted_vals[:, :k], order[:, :k]
