"""Prompt logprobs: the log-probabilities of a prompt's own tokens, from its prefill's hidden states.

The logits at position p predict token p + 1, so a prefill chunk over positions [s, e) of a
prompt of P tokens gives the logprobs of prompt tokens s + 1 .. min(e, P - 1) (the first token
has none: nothing comes before it). The LM head runs on those rows only for the requests that ask
(`prompt_logprobs` in SamplingParams); every other row of the step gets logits as before, at its
last position only, and a step without such a request does nothing here. Every chunk of a chunked
prefill contributes its rows; the scheduler gathers them, in order, and sends them with the
request's first token. A request that asks skips the prefix cache (`BlockManager`), as vLLM's do:
cached blocks have no logits.

Per position: the prompt token's logprob and rank (1 + the number of tokens with a higher
logprob), then the k best tokens (ties: lower id first, the sampler's rule). The distribution is
the raw model's, in float32, like the sampled tokens' logprobs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.core.outputs import PromptLogprobsChunk
from engine.sample.filters import top_tokens

# LM-head rows per pass: [rows, vocab] float32 logits at a time (256 x 152k vocabulary: 150 MiB)
ROWS_PER_PASS = 256


@dataclass
class PromptLogprobRows:
    """The flat-batch rows whose logits give prompt logprobs this step, grouped by request."""

    request_ids: list[str]
    first_positions: list[int]  # per request: the position of its first row here
    counts: np.ndarray  # [requests] rows per request
    k: list[int]  # per request: alternatives asked for
    rows: torch.Tensor  # [total] flat-batch rows (int64, on the device)
    targets: torch.Tensor  # [total] the prompt token each row predicts (int64, on the device)


def select_rows(request_ids: list[str], rows: np.ndarray, qsl: np.ndarray, num_computed: np.ndarray,
                seq_lens: np.ndarray, num_prompt: np.ndarray, wanted: np.ndarray, token_ids: torch.Tensor,
                max_model_len: int) -> PromptLogprobRows | None:
    """The rows of the requests (batch order; `rows` their batch rows) that ask and are still in
    their prompt; None if there are none. `wanted`: per request k, -1 for none; `token_ids`: the
    batch's device token table [batch rows, max_model_len]."""
    ends = np.minimum(seq_lens, num_prompt - 1)  # the last prompt position predicts the first output
    asking = np.flatnonzero((wanted >= 0) & (num_computed < ends))
    if not len(asking):
        return None
    starts, counts = num_computed[asking], ends[asking] - num_computed[asking]
    total = int(counts.sum())
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    flat_rows = np.repeat(qsl[asking], counts) + offsets
    positions = np.repeat(starts, counts) + offsets
    table_index = np.repeat(rows[asking], counts) * max_model_len + positions + 1
    device = token_ids.device
    targets = token_ids.view(-1).index_select(0, torch.from_numpy(table_index).to(device)).long()
    return PromptLogprobRows([request_ids[i] for i in asking], starts.tolist(), counts, wanted[asking].tolist(),
                             torch.from_numpy(flat_rows).to(device), targets)


def compute(select: PromptLogprobRows, hidden: torch.Tensor, compute_logits) -> dict[str, PromptLogprobsChunk]:
    """The LM head on the selected rows (in passes of ROWS_PER_PASS), then each request's entries."""
    max_k = max(select.k)
    ids_parts, value_parts, rank_parts = [], [], []
    for start in range(0, len(select.rows), ROWS_PER_PASS):
        rows = select.rows[start:start + ROWS_PER_PASS]
        targets = select.targets[start:start + ROWS_PER_PASS].unsqueeze(1)
        logprobs = compute_logits(hidden.index_select(0, rows)).float().log_softmax(dim=-1)
        chosen = logprobs.gather(1, targets)
        rank_parts.append((logprobs > chosen).sum(dim=-1) + 1)
        if max_k:
            vals, ids = top_tokens(logprobs, max_k)
            ids_parts.append(torch.cat((targets, ids), 1))
            value_parts.append(torch.cat((chosen, vals), 1))
        else:
            ids_parts.append(targets)
            value_parts.append(chosen)
    all_ids: list[list[int]] = torch.cat(ids_parts).tolist()
    values: list[list[float]] = torch.cat(value_parts).tolist()
    ranks: list[int] = torch.cat(rank_parts).tolist()
    out = {}
    first = 0
    for request_id, position, count, k in zip(select.request_ids, select.first_positions, select.counts.tolist(),
                                              select.k, strict=True):
        span = range(first, first + count)
        out[request_id] = PromptLogprobsChunk(position, [all_ids[r][: k + 1] for r in span],
                                              [values[r][: k + 1] for r in span], ranks[first:first + count])
        first += count
    return out
