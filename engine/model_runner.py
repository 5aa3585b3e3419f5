"""Turns a scheduled batch into one flat forward pass and samples the next tokens.

Inputs are laid out as one [num_tokens] batch (no padding): decode rows first, then prefill
chunks, described by positions, a slot mapping and block tables. The LM head runs only on the
last row of each sequence whose scheduled tokens reach its end (a partial prefill chunk
samples nothing).
"""
from __future__ import annotations

import torch

from engine.forward_context import AttentionMetadata, ForwardContext, PrefillChunk, forward_context
from engine.models.llama import CausalLM
from engine.request import Request
from engine.sampler import Sampler, SamplerOutput
from engine.sampling_batch import SamplingBatch
from engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: CausalLM, kv_caches, block_size: int, device: torch.device,
                 eos_token_ids: set[int], seed: int):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.vocab_size = model.arch.vocab_size
        self.eos_token_ids = eos_token_ids
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        self.sampler = Sampler(generator)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[list[Request], SamplerOutput | None]:
        """Run one step; returns the requests that sampled a token, and their tokens, in order."""
        input_ids, positions, meta, sample_rows, sample_reqs = self._prepare(batch)
        with forward_context(ForwardContext(meta, self.kv_caches)):
            hidden = self.model(input_ids, positions)
        if not sample_reqs:
            return [], None
        logits = self.model.compute_logits(hidden[sample_rows])  # [num_sampled, vocab]
        sampling = SamplingBatch.build(sample_reqs, self.vocab_size, self.eos_token_ids, self.device)
        return sample_reqs, self.sampler(logits, sampling)

    def _prepare(self, batch: ScheduledBatch):
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        for req, num_new in batch.entries:
            start = req.num_computed_tokens
            end = start + num_new
            row = len(input_ids)
            input_ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            blocks = req.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            if num_new == 1:
                decode_tables.append(blocks[: (end + bs - 1) // bs])
                decode_lens.append(end)
            else:
                prefills.append(self._prefill_chunk(row, start, end, blocks))
            if end == req.num_tokens:
                sample_rows.append(row + num_new - 1)
                sample_reqs.append(req)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_decode_tokens=len(decode_lens),
            decode_block_tables=None,
            decode_mask=None,
            prefills=prefills,
        )
        if decode_lens:
            width = max(len(t) for t in decode_tables)
            tables = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables], dtype=torch.int64, device=dev)
            lens = torch.tensor(decode_lens, dtype=torch.int64, device=dev)
            key_pos = torch.arange(width * bs, device=dev)
            meta.decode_block_tables = tables
            past_end = key_pos.unsqueeze(0) >= lens.unsqueeze(1)  # [seqs, keys]
            num_kv_heads = self.model.arch.num_kv_heads
            meta.decode_mask = past_end.repeat(num_kv_heads, 1).unsqueeze(1)  # [kv_heads * seqs, 1, keys]
        return (torch.tensor(input_ids, dtype=torch.int64, device=dev),
                torch.tensor(positions, dtype=torch.int64, device=dev),
                meta, torch.tensor(sample_rows, dtype=torch.int64, device=dev), sample_reqs)

    def _prefill_chunk(self, row: int, start: int, end: int, blocks: list[int]) -> PrefillChunk:
        bs, dev = self.block_size, self.device
        block_ids = torch.tensor(blocks[: (end + bs - 1) // bs], dtype=torch.int64, device=dev)
        mask = None
        if start > 0:  # queries at positions start..end-1 see keys 0..their own position
            q_pos = torch.arange(start, end, device=dev).unsqueeze(1)
            mask = torch.arange(end, device=dev).unsqueeze(0) <= q_pos  # [query_len, context_len]
        return PrefillChunk(row, end - start, end, block_ids, mask)
