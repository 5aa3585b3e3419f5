"""The largest step, run once on dummy inputs before the KV cache exists: its activation memory.

On CUDA the KV cache takes what `--gpu-memory-utilization` leaves after the weights and the peak
activations of the largest step (vLLM's profile run): one prompt chunk of max_num_batched_tokens
tokens, then logits for max_num_seqs rows. The chunk attends over a small cache of its own,
freed afterwards.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.attention.base import AttentionBackend, StepInputs
from engine.attention.forward_context import ForwardContext, forward_context
from engine.models.llama import CausalLM
from engine.runner.kv_cache import allocate_kv_caches
from engine.utils import cdiv


def largest_step_inputs(num_tokens: int, block_size: int, device: torch.device) -> StepInputs:
    """One request of num_tokens new tokens at positions 0.., in blocks 0.."""
    num_blocks = cdiv(num_tokens, block_size)
    qsl = np.array([0, num_tokens], np.int64)
    seq_lens = np.array([num_tokens], np.int64)
    positions = torch.arange(num_tokens, device=device)
    return StepInputs(1, num_tokens, block_size, torch.tensor(qsl, dtype=torch.int32, device=device), qsl,
                      torch.tensor(seq_lens, dtype=torch.int32, device=device), seq_lens, np.zeros(1, np.int64),
                      positions, positions.clone(),
                      torch.arange(num_blocks, dtype=torch.int32, device=device).unsqueeze(0))


@torch.inference_mode()
def run_largest_step(model: CausalLM, backend: AttentionBackend, dtype: torch.dtype, device: torch.device,
                     num_tokens: int, num_logits: int, block_size: int) -> torch.Tensor:
    """The forward of the largest step and its logits ([num_logits, vocab]), on throwaway KV blocks."""
    arch = model.arch
    caches = allocate_kv_caches(arch.num_layers, backend.kv_cache_shape(cdiv(num_tokens, block_size)), dtype,
                                device)
    inputs = largest_step_inputs(num_tokens, block_size, device)
    ids = torch.zeros(num_tokens, dtype=torch.int32, device=device)
    with forward_context(ForwardContext(backend, backend.build_metadata(inputs), caches)):
        hidden = model(ids, inputs.positions)
    rows = torch.linspace(0, num_tokens - 1, min(num_logits, num_tokens), device=device).long()
    return model.compute_logits(hidden.index_select(0, rows))


def peak_activation_bytes(model: CausalLM, backend: AttentionBackend, dtype: torch.dtype, device: torch.device,
                          num_tokens: int, num_logits: int, block_size: int) -> int:
    """CUDA: the most memory the largest step holds beyond what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    run_largest_step(model, backend, dtype, device, num_tokens, num_logits, block_size)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return peak
