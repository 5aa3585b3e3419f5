"""Per-row sampling state that persists across steps, and the per-step view the sampler reads.

A request's parameters are written once, when it gets a batch row (new, or resumed after a
preemption): host columns (numpy) that decide which paths a step takes without reading the device,
and, only for rows that use them, [rows, vocab] device tensors kept current by one `index_put_`
of the sampled ids per step (each row samples one token per step, so no index repeats):

- `output_counts`: occurrences of each token in the output (every penalised row);
- `seen`: prompt or output tokens, for the repetition penalty;
- `additive`: what is added to each logit after the repetition penalty, all in one row:
  logit_bias - frequency_penalty x count - presence_penalty x [count > 0], and -inf on the stop
  ids while a request is below min_tokens (that ban is lifted once, when it reaches min_tokens).

No per-step work grows with a request's history, and applying penalties and bias to a batch is
one gather and one add.
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
    repetition_idx: torch.Tensor | None  # [num_repetition] positions
    repetition_rows: torch.Tensor | None  # [num_repetition] state rows
    repetition_penalty: torch.Tensor | None  # [num_repetition, 1] float32
    additive_idx: torch.Tensor | None  # [num_additive] positions
    additive_rows: torch.Tensor | None  # [num_additive] state rows
    # every position is additive and their rows are consecutive: the state rows as a view, no gather
    additive_row_range: slice | None
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
        self.counts_outputs = np.zeros(n, bool)  # any penalty: output_counts is kept
        self.uses_repetition = np.zeros(n, bool)
        self.uses_additive = np.zeros(n, bool)
        self.is_seeded = np.zeros(n, bool)
        self.generators: dict[int, torch.Generator] = {}
        self.num_output_tokens = np.zeros(n, np.int64)
        # row -> (min_tokens, ids banned until then, their logit_bias values)
        self.min_tokens_bans: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}
        self.output_counts: torch.Tensor | None = None  # [rows, vocab] float32
        self.seen: torch.Tensor | None = None  # [rows, vocab] bool
        self.additive: torch.Tensor | None = None  # [rows, vocab] float32
        self._max_num_seqs = n

    # ---- rows come and go ----------------------------------------------------------------

    def add_row(self, row: int, params: SamplingParams, prompt_token_ids: list[int],
                output_token_ids: list[int], generator: torch.Generator | None) -> None:
        """Write a request's parameters into `row`; every column is overwritten, so a reused row
        carries nothing of its previous request. A resumed request's outputs so far are counted
        here, once."""
        p = params
        self.temperature[row] = p.temperature
        self.top_k[row] = p.top_k if 0 < p.top_k < self.vocab_size else self.vocab_size  # larger: off
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
        self.min_tokens_bans.pop(row, None)
        self.uses_repetition[row] = p.repetition_penalty != 1.0
        self.counts_outputs[row] = self.uses_repetition[row] or p.presence_penalty != 0 or p.frequency_penalty != 0
        counts = None
        if self.counts_outputs[row]:
            counts = self._rows("output_counts", torch.float32)[row]
            counts.zero_()
            if output_token_ids:
                counts.index_put_((self._ids(output_token_ids),), torch.ones(len(output_token_ids),
                                                                            device=self.device), accumulate=True)
        if self.uses_repetition[row]:
            seen = self._rows("seen", torch.bool)[row]
            seen.zero_()
            seen[self._ids(prompt_token_ids + output_token_ids)] = True
        banned = sorted(stop_token_ids(p, self.eos_token_ids)) if len(output_token_ids) < p.min_tokens else []
        self.uses_additive[row] = bool(p.logit_bias or banned or p.presence_penalty or p.frequency_penalty)
        if self.uses_additive[row]:
            additive = self._rows("additive", torch.float32)[row]
            additive.zero_()
            if p.logit_bias:
                additive[self._ids(list(p.logit_bias))] = torch.tensor(list(p.logit_bias.values()),
                                                                        dtype=torch.float32, device=self.device)
            if counts is not None:
                additive -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
            if banned:
                ids = self._ids(banned)
                self.min_tokens_bans[row] = (p.min_tokens, ids, additive[ids].clone())
                additive[ids] = float("-inf")

    def remove_row(self, row: int) -> None:
        self.generators.pop(row, None)
        self.min_tokens_bans.pop(row, None)
        self.is_seeded[row] = False
        self.counts_outputs[row] = self.uses_repetition[row] = self.uses_additive[row] = False

    def record_sampled(self, rows: np.ndarray, rows_dev: torch.Tensor, sampled: torch.Tensor) -> None:
        """After a step: fold the sampled ids ([len(rows)] on the device) into the rows that keep
        state, and lift the min_tokens ban of rows that reached it."""
        np.add.at(self.num_output_tokens, rows, 1)  # a row repeats once per accepted draft token
        counted = self.counts_outputs[rows]
        if counted.any():
            pos = None if counted.all() else _to(np.flatnonzero(counted), self.device)
            r = rows_dev if pos is None else rows_dev[pos]
            t = sampled if pos is None else sampled[pos]
            counted_rows = rows[counted]
            assert self.output_counts is not None
            if self.uses_additive[counted_rows].any():  # before counting: presence applies once
                assert self.additive is not None
                first = (self.output_counts[r, t] == 0).float()
                freq = _to(self.frequency_penalty[counted_rows], self.device)
                presence = _to(self.presence_penalty[counted_rows], self.device)
                self.additive.index_put_((r, t), -(freq + presence * first), accumulate=True)
            self.output_counts.index_put_((r, t), torch.ones(len(t), device=self.device), accumulate=True)
            if self.uses_repetition[counted_rows].any():
                assert self.seen is not None
                self.seen.index_put_((r, t), torch.ones(len(t), dtype=torch.bool, device=self.device))
        reached = [row for row, (min_tokens, _, _) in self.min_tokens_bans.items()
                   if self.num_output_tokens[row] >= min_tokens]
        for row in reached:
            _, ids, bias = self.min_tokens_bans.pop(row)
            assert self.additive is not None
            restored = bias.clone()
            if self.counts_outputs[row]:
                assert self.output_counts is not None
                counts = self.output_counts[row, ids]
                restored -= float(self.frequency_penalty[row]) * counts + float(self.presence_penalty[row]) * (
                    counts > 0).float()
            self.additive[row, ids] = restored

    # ---- the per-step view ---------------------------------------------------------------

    def metadata(self, rows: np.ndarray) -> SamplingMetadata:
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
            generators=[], repetition_idx=None, repetition_rows=None, repetition_penalty=None, additive_idx=None,
            additive_rows=None, additive_row_range=None, num_logprobs=self.num_logprobs[rows],
            max_num_logprobs=int(self.num_logprobs[rows].max()) if n else -1)
        if num_random:
            random_rows = rows[random_pos]
            md.temperature = _to(temperature[random_pos], dev).unsqueeze(1)
            top_k = self.top_k[random_rows]
            on = top_k < self.vocab_size
            if on.any():  # the largest k in use (rows with top-k off must not widen the top-k pass)
                md.top_k, md.max_top_k = _to(top_k, dev), int(top_k[on].max())
            top_p = self.top_p[random_rows]
            if (top_p < 1.0).any():
                md.top_p = _to(top_p, dev)
            min_p = self.min_p[random_rows]
            if (min_p > 0.0).any():
                md.min_p = _to(min_p, dev)
            seeded = np.flatnonzero(self.is_seeded[random_rows])
            md.generators = [(int(i), self.generators[int(random_rows[i])]) for i in seeded]
        repetition = np.flatnonzero(self.uses_repetition[rows])
        if len(repetition):
            md.repetition_idx, md.repetition_rows = _to(repetition, dev), _to(rows[repetition], dev)
            md.repetition_penalty = _to(self.repetition_penalty[rows[repetition]], dev).unsqueeze(1)
        additive = np.flatnonzero(self.uses_additive[rows])
        if len(additive) == n and (np.diff(rows) == 1).all():
            md.additive_row_range = slice(int(rows[0]), int(rows[0]) + n)
        elif len(additive):
            md.additive_idx, md.additive_rows = _to(additive, dev), _to(rows[additive], dev)
        return md

    # ---- internals -----------------------------------------------------------------------

    def _rows(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """A [rows, vocab] state tensor, allocated the first time a request needs it."""
        t = getattr(self, name)
        if t is None:
            t = torch.zeros(self._max_num_seqs, self.vocab_size, dtype=dtype, device=self.device)
            setattr(self, name, t)
        return t

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor(token_ids, dtype=torch.int64, device=self.device)


def _to(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on the device: as is on CPU, through pinned memory on CUDA."""
    t = torch.from_numpy(np.ascontiguousarray(values))
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)
