"""The persistent batch: one row per request that holds a place in the runner, kept across steps.

A request gets a row when it is scheduled (new, or resumed after a preemption) and loses it when
it finishes, is aborted or preempted. The row holds its tokens (a device table the next step's
input ids are gathered from, so a sampled id never travels to the host and back), its block table
(written when blocks are allocated, never rebuilt), its progress and its sampling state.
"""
from __future__ import annotations

import heapq

import numpy as np
import torch

from engine.runner.buffers import CpuGpuBuffer
from engine.sample.state import SamplingState
from engine.utils import cdiv


class InputBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int, vocab_size: int,
                 device: torch.device, eos_token_ids: set[int]):
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.device = device
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(max_num_seqs))  # a heap: the lowest free row is taken first
        # [rows, max_model_len] int32: prompt then sampled ids; only [row, :num_tokens[row]] is valid
        self.token_ids = torch.zeros(max_num_seqs, max_model_len, dtype=torch.int32, device=device)
        self.num_tokens = np.zeros(max_num_seqs, np.int64)
        self.num_computed_tokens = np.zeros(max_num_seqs, np.int64)
        # [rows, max_blocks_per_seq] int32; entries past a row's num_blocks are stale or 0, but always
        # valid block ids, and attention masks them by sequence length
        self.block_table = CpuGpuBuffer((max_num_seqs, cdiv(max_model_len, block_size)), torch.int32, device)
        self.num_blocks = np.zeros(max_num_seqs, np.int64)
        self.batch_invariant = np.zeros(max_num_seqs, bool)  # rows whose outputs must not depend on the batch
        self.lora_id = np.zeros(max_num_seqs, np.int64)  # the row's LoRA adapter id, 0: the base model
        # Prompt logprobs: per row the alternatives asked for (-1: none), and how many rows ask
        self.num_prompt_tokens = np.zeros(max_num_seqs, np.int64)
        self.prompt_logprobs = np.full(max_num_seqs, -1, np.int64)
        self.num_prompt_logprob_rows = 0
        self.sampling = SamplingState(max_num_seqs, vocab_size, device, eos_token_ids)

    def add(self, request_id: str, token_ids: list[int], num_prompt_tokens: int, block_ids: list[int],
            num_computed_tokens: int, params, generator: torch.Generator | None) -> int:
        assert request_id not in self.row_of, f"{request_id} already has a row"
        assert len(token_ids) <= self.max_model_len
        row = heapq.heappop(self._free_rows)
        self.row_of[request_id] = row
        n = len(token_ids)
        self.token_ids[row, :n] = torch.tensor(token_ids, dtype=torch.int32).to(self.device, non_blocking=True)
        self.num_tokens[row] = n
        self.num_computed_tokens[row] = num_computed_tokens
        self.num_blocks[row] = 0
        self.batch_invariant[row] = params.batch_invariant
        self.lora_id[row] = 0 if params.lora is None else params.lora.id
        self.num_prompt_tokens[row] = num_prompt_tokens
        self.prompt_logprobs[row] = -1 if params.prompt_logprobs is None else params.prompt_logprobs
        self.num_prompt_logprob_rows += params.prompt_logprobs is not None
        self.append_blocks(row, block_ids)
        self.sampling.add_row(row, params, token_ids[:num_prompt_tokens], token_ids[num_prompt_tokens:], generator)
        return row

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is None:
            return  # never had a row here (aborted while waiting) or already gone
        self.sampling.remove_row(row)
        self.lora_id[row] = 0
        if self.prompt_logprobs[row] >= 0:
            self.prompt_logprobs[row] = -1
            self.num_prompt_logprob_rows -= 1
        heapq.heappush(self._free_rows, row)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        self.block_table.np[row, start:start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def write_draft(self, row: int, draft: list[int]) -> None:
        """Draft tokens after the row's known ones: the step's input, not (yet) its tokens."""
        n = int(self.num_tokens[row])
        assert n + len(draft) <= self.max_model_len, "a draft ran past max_model_len"
        self.token_ids[row, n:n + len(draft)] = torch.tensor(draft, dtype=torch.int32).to(self.device)

    def append_sampled(self, rows: np.ndarray, rows_dev: torch.Tensor, sampled: torch.Tensor,
                       offsets: np.ndarray | None = None) -> None:
        """Write this step's sampled ids ([len(rows)] on the device) after each row's tokens; a row
        that appears several times (an accepted draft) gets them at `offsets` 0, 1, ..."""
        positions = self.num_tokens[rows] if offsets is None else self.num_tokens[rows] + offsets
        assert (positions < self.max_model_len).all(), "a request ran past max_model_len"
        pos_dev = torch.from_numpy(positions).to(self.device, non_blocking=True)
        self.token_ids.index_put_((rows_dev, pos_dev), sampled.to(torch.int32))
        np.add.at(self.num_tokens, rows, 1)
        self.sampling.record_sampled(rows, rows_dev, sampled)
