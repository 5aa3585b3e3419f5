"""Per-row sampling state that persists across steps, and the per-step view the sampler reads.

A request's parameters are written once, when it gets a batch row (new, or resumed after a
preemption): host columns (numpy) that decide which paths a step takes without reading the device,
and, only for rows that use them, [rows, vocab] device tensors: the prompt-presence mask
(repetition penalty), the output-token counts (all three penalties; one `index_put_` of the sampled
ids per step keeps them current) and the bias row (logit_bias, plus -inf on the stop ids while a
request is below min_tokens; that ban is lifted once, when the request reaches min_tokens). No
per-step work grows with a request's history.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.messages import SamplingParams
from engine.core.stop import stop_token_ids


@dataclass
class SamplingMetadata:
    """What the sampler needs for one step's sampled rows, in batch order (position i = row i of
    the logits). Index tensors select batch positions; `*_rows` select state rows."""

    num_rows: int
    all_greedy: bool
    greedy_idx: torch.Tensor | None  # [num_greedy] positions (None when all or none are greedy)
    random_idx: torch.Tensor | None  # [num_random] positions (None when all are random)
    num_random: int
    temperature: torch.Tensor | None  # [num_random, 1] float32
    top_k: torch.Tensor | None  # [num_random] int64, vocab_size where off; None when no row uses it
    max_top_k: int
    top_p: torch.Tensor | None  # [num_random] float32, 1.0 where off
    min_p: torch.Tensor | None  # [num_random] float32, 0.0 where off
    generators: list[tuple[int, torch.Generator]]  # (position among the random rows, its generator)
    penalty_idx: torch.Tensor | None  # [num_penalised] positions
    penalty_rows: torch.Tensor | None  # [num_penalised] state rows
    repetition_penalty: torch.Tensor | None  # [num_penalised, 1] float32 (None when all 1)
    presence_penalty: torch.Tensor | None  # [num_penalised, 1]
    frequency_penalty: torch.Tensor | None  # [num_penalised, 1]
    bias_idx: torch.Tensor | None  # [num_biased] positions
    bias_rows: torch.Tensor | None  # [num_biased] state rows
    num_logprobs: np.ndarray  # [num_rows] int: -1 = none, k >= 0 = sampled token plus k alternatives
    max_num_logprobs: int  # -1 when no row wants logprobs


class SamplingState:
    def __init__(self, max_num_seqs: int, vocab_size: int, device: torch.device, eos_token_ids: set[int]):
        n = max_num_seqs
        self.vocab_size = vocab_size
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.temperature = np.zeros(n, np.float32)
        self.top_k = np.full(n, vocab_size, np.int64)
        self.top_p = np.ones(n, np.float32)
        self.min_p = np.zeros(n, np.float32)
        self.repetition_penalty = np.ones(n, np.float32)
        self.presence_penalty = np.zeros(n, np.float32)
        self.frequency_penalty = np.zeros(n, np.float32)
        self.num_logprobs = np.full(n, -1, np.int64)
        self.uses_penalties = np.zeros(n, bool)
        self.uses_bias = np.zeros(n, bool)
        self.is_seeded = np.zeros(n, bool)
        self.generators: dict[int, torch.Generator] = {}
        self.num_output_tokens = np.zeros(n, np.int64)
        # row -> (min_tokens, ids banned until then, their logit_bias values to restore)
        self.min_tokens_bans: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}
        self.has_logit_bias = np.zeros(n, bool)
        self._output_counts: torch.Tensor | None = None  # [rows, vocab] float32
        self._prompt_mask: torch.Tensor | None = None  # [rows, vocab] bool
        self._bias: torch.Tensor | None = None  # [rows, vocab] float32
        self._max_num_seqs = n

    # ---- rows come and go ----------------------------------------------------------------

    def add_row(self, row: int, params: SamplingParams, prompt_token_ids: list[int],
                output_token_ids: list[int], generator: torch.Generator | None) -> None:
        """Write a request's parameters into `row`; every column is overwritten, so a reused row
        carries nothing of its previous request."""
        p = params
        self.temperature[row] = p.temperature
        self.top_k[row] = p.top_k if p.top_k > 0 else self.vocab_size
        self.top_p[row] = p.top_p
        self.min_p[row] = p.min_p
        self.repetition_penalty[row] = p.repetition_penalty
        self.presence_penalty[row] = p.presence_penalty
        self.frequency_penalty[row] = p.frequency_penalty
        self.num_logprobs[row] = -1 if p.logprobs is None else p.logprobs
        self.num_output_tokens[row] = len(output_token_ids)
        self.is_seeded[row] = generator is not None
        if generator is not None:
            self.generators[row] = generator
        self.uses_penalties[row] = (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                                    or p.frequency_penalty != 0.0)
        if self.uses_penalties[row]:
            self._fill_counts(row, output_token_ids)
            if p.repetition_penalty != 1.0:
                mask = self._rows_tensor("_prompt_mask", torch.bool)[row]
                mask.zero_()
                mask[torch.tensor(prompt_token_ids, dtype=torch.int64, device=self.device)] = True
        self._write_bias(row, p, len(output_token_ids))

    def remove_row(self, row: int) -> None:
        self.generators.pop(row, None)
        self.min_tokens_bans.pop(row, None)
        self.is_seeded[row] = False
        self.uses_penalties[row] = False
        self.uses_bias[row] = False

    def record_sampled(self, rows: np.ndarray, rows_dev: torch.Tensor, sampled: torch.Tensor) -> None:
        """After a step: count the sampled ids ([len(rows)] on the device) for penalised rows, and
        lift the min_tokens ban of rows that reached it."""
        self.num_output_tokens[rows] += 1
        penalised = self.uses_penalties[rows]
        if penalised.any():
            counts = self._output_counts
            assert counts is not None
            if penalised.all():
                counts.index_put_((rows_dev, sampled), torch.ones_like(sampled, dtype=counts.dtype), accumulate=True)
            else:
                pos = torch.from_numpy(np.flatnonzero(penalised)).to(self.device)
                counts.index_put_((rows_dev[pos], sampled[pos]), torch.ones(len(pos), device=self.device),
                                  accumulate=True)
        reached = [r for r, (min_tokens, _, _) in self.min_tokens_bans.items()
                   if self.num_output_tokens[r] >= min_tokens]
        for row in reached:
            _, ids, restore = self.min_tokens_bans.pop(row)
            assert self._bias is not None
            self._bias[row, ids] = restore
            self.uses_bias[row] = self.has_logit_bias[row]

    # ---- the per-step view ---------------------------------------------------------------

    def metadata(self, rows: np.ndarray, rows_dev: torch.Tensor) -> SamplingMetadata:
        """The sampled rows' parameters, in batch order (`rows[i]` is batch position i)."""
        dev = self.device
        n = len(rows)
        temperature = self.temperature[rows]
        random = temperature > 0
        num_random = int(random.sum())
        random_pos = np.flatnonzero(random)
        greedy_idx = random_idx = None
        if 0 < num_random < n:
            random_idx = _to(random_pos, dev)
            greedy_idx = _to(np.flatnonzero(~random), dev)
        md = SamplingMetadata(
            num_rows=n, all_greedy=num_random == 0, greedy_idx=greedy_idx, random_idx=random_idx,
            num_random=num_random, temperature=None, top_k=None, max_top_k=self.vocab_size, top_p=None, min_p=None,
            generators=[], penalty_idx=None, penalty_rows=None, repetition_penalty=None, presence_penalty=None,
            frequency_penalty=None, bias_idx=None, bias_rows=None, num_logprobs=self.num_logprobs[rows],
            max_num_logprobs=int(self.num_logprobs[rows].max()) if n else -1)
        if num_random:
            random_rows = rows[random_pos]
            md.temperature = _to(temperature[random_pos], dev).unsqueeze(1)
            top_k = self.top_k[random_rows]
            if (top_k < self.vocab_size).any():
                md.top_k, md.max_top_k = _to(top_k, dev), int(top_k.max())
            top_p = self.top_p[random_rows]
            if (top_p < 1.0).any():
                md.top_p = _to(top_p, dev)
            min_p = self.min_p[random_rows]
            if (min_p > 0.0).any():
                md.min_p = _to(min_p, dev)
            seeded = np.flatnonzero(self.is_seeded[random_rows])
            md.generators = [(int(i), self.generators[int(random_rows[i])]) for i in seeded]
        penalised = np.flatnonzero(self.uses_penalties[rows])
        if len(penalised):
            pen_rows = rows[penalised]
            md.penalty_idx, md.penalty_rows = _to(penalised, dev), _to(pen_rows, dev)
            for name, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
                values = getattr(self, name)[pen_rows]
                if (values != off).any():
                    setattr(md, name, _to(values, dev).unsqueeze(1))
        biased = np.flatnonzero(self.uses_bias[rows])
        if len(biased):
            md.bias_idx, md.bias_rows = _to(biased, dev), _to(rows[biased], dev)
        return md

    @property
    def output_counts(self) -> torch.Tensor | None:
        return self._output_counts

    @property
    def prompt_mask(self) -> torch.Tensor | None:
        return self._prompt_mask

    @property
    def bias(self) -> torch.Tensor | None:
        return self._bias

    # ---- internals -----------------------------------------------------------------------

    def _rows_tensor(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """A [rows, vocab] state tensor, allocated the first time a request needs it."""
        t = getattr(self, name)
        if t is None:
            t = torch.zeros(self._max_num_seqs, self.vocab_size, dtype=dtype, device=self.device)
            setattr(self, name, t)
        return t

    def _fill_counts(self, row: int, output_token_ids: list[int]) -> None:
        counts = self._rows_tensor("_output_counts", torch.float32)[row]
        counts.zero_()
        if output_token_ids:  # a resumed request: its outputs so far, counted once
            ids = torch.tensor(output_token_ids, dtype=torch.int64, device=self.device)
            counts.index_put_((ids,), torch.ones(len(ids), device=self.device), accumulate=True)

    def _write_bias(self, row: int, p: SamplingParams, num_output_tokens: int) -> None:
        self.min_tokens_bans.pop(row, None)
        self.has_logit_bias[row] = bool(p.logit_bias)
        banned = sorted(stop_token_ids(p, self.eos_token_ids)) if num_output_tokens < p.min_tokens else []
        if not p.logit_bias and not banned:
            self.uses_bias[row] = False
            return
        bias = self._rows_tensor("_bias", torch.float32)[row]
        bias.zero_()
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), dtype=torch.int64, device=self.device)
            bias[ids] = torch.tensor(list(p.logit_bias.values()), dtype=torch.float32, device=self.device)
        if banned:
            ids = torch.tensor(banned, dtype=torch.int64, device=self.device)
            self.min_tokens_bans[row] = (p.min_tokens, ids, bias[ids].clone())
            bias[ids] = float("-inf")
        self.uses_bias[row] = True


def _to(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on the device: as is on CPU, through pinned memory on CUDA."""
    t = torch.from_numpy(np.ascontiguousarray(values))
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)
