"""Per-step sampling parameters of a batch, as device tensors built once per step."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Request


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # [num_seqs] float32; 0 rows are greedy
    top_k: torch.Tensor | None  # [num_seqs] int64, vocab_size where off; None when no row uses it
    top_p: torch.Tensor | None  # [num_seqs] float32
    min_p: torch.Tensor | None  # [num_seqs] float32
    repetition_penalty: torch.Tensor | None  # [num_seqs, 1] float32
    presence_penalty: torch.Tensor | None  # [num_seqs, 1] float32
    frequency_penalty: torch.Tensor | None  # [num_seqs, 1] float32
    prompt_mask: torch.Tensor | None  # [num_seqs, vocab] bool: token occurs in the prompt
    output_counts: torch.Tensor | None  # [num_seqs, vocab] float32: occurrences in the output
    bias: torch.Tensor | None  # [num_seqs, vocab] float32: logit_bias plus -inf for banned stops
    all_greedy: bool
    generators: list[torch.Generator | None]  # per row; None rows use the engine's generator
    max_num_logprobs: int  # -1 when no row wants logprobs
    num_logprobs: list[int | None]

    @classmethod
    def build(cls, reqs: list[Request], vocab_size: int, eos_token_ids: set[int], device) -> "SamplingBatch":
        ps = [r.params for r in reqs]
        n = len(reqs)

        def column(values, dtype, default):
            if all(v == default for v in values):
                return None
            return torch.tensor(values, dtype=dtype, device=device)

        top_k = column([p.top_k if p.top_k > 0 else vocab_size for p in ps], torch.int64, vocab_size)
        rep = column([p.repetition_penalty for p in ps], torch.float32, 1.0)
        pres = column([p.presence_penalty for p in ps], torch.float32, 0.0)
        freq = column([p.frequency_penalty for p in ps], torch.float32, 0.0)
        prompt_mask = output_counts = None
        if rep is not None:
            prompt_mask = torch.zeros(n, vocab_size, dtype=torch.bool, device=device)
            for i, r in enumerate(reqs):
                prompt_mask[i, torch.tensor(r.prompt_token_ids, device=device)] = True
        if rep is not None or pres is not None or freq is not None:
            output_counts = _output_counts(reqs, vocab_size, device)
        bias = _bias(reqs, vocab_size, eos_token_ids, device)
        return cls(
            temperature=torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=device),
            top_k=top_k,
            top_p=column([p.top_p for p in ps], torch.float32, 1.0),
            min_p=column([p.min_p for p in ps], torch.float32, 0.0),
            repetition_penalty=None if rep is None else rep.unsqueeze(1),
            presence_penalty=None if pres is None else pres.unsqueeze(1),
            frequency_penalty=None if freq is None else freq.unsqueeze(1),
            prompt_mask=prompt_mask,
            output_counts=output_counts,
            bias=bias,
            all_greedy=all(p.temperature == 0 for p in ps),
            generators=[r.generator for r in reqs],
            max_num_logprobs=max((p.logprobs for p in ps if p.logprobs is not None), default=-1),
            num_logprobs=[p.logprobs for p in ps],
        )


def _output_counts(reqs: list[Request], vocab_size: int, device) -> torch.Tensor:
    longest = max(len(r.output_token_ids) for r in reqs)
    ids = torch.full((len(reqs), longest + 1), vocab_size, dtype=torch.int64)  # pad to a spare column
    for i, r in enumerate(reqs):
        ids[i, : len(r.output_token_ids)] = torch.tensor(r.output_token_ids, dtype=torch.int64)
    counts = torch.zeros(len(reqs), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids.to(device), torch.ones_like(ids, dtype=torch.float32, device=device))
    return counts[:, :vocab_size]


def _bias(reqs: list[Request], vocab_size: int, eos_token_ids: set[int], device) -> torch.Tensor | None:
    """logit_bias, and -inf on EOS / stop ids while a request is below its min_tokens."""
    rows: dict[int, dict[int, float]] = {}
    for i, r in enumerate(reqs):
        p = r.params
        entry: dict[int, float] = dict(p.logit_bias or {})
        if r.num_output_tokens < p.min_tokens:
            for t in (set(p.stop_token_ids) | (set() if p.ignore_eos else eos_token_ids)):
                entry[t] = float("-inf")
        if entry:
            rows[i] = entry
    if not rows:
        return None
    bias = torch.zeros(len(reqs), vocab_size, dtype=torch.float32)
    for i, entry in rows.items():
        bias[i, list(entry.keys())] = torch.tensor(list(entry.values()), dtype=torch.float32)
    return bias.to(device)
