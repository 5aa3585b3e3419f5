"""The seam between the model runner and an attention implementation.

The runner describes a step with kernel-agnostic inputs (`StepInputs`); a backend turns them into
whatever metadata its kernel wants (`build_metadata`), stores this step's K/V and attends
(`forward`), and owns the KV cache layout (`kv_cache_shape`). The models call
`engine.attention.paged_attention`, which reaches the backend through the forward context, so a
native CPU kernel or a CUDA kernel plugs in without touching the models or the runner.

A backend may want the scheduled requests in a particular order (the torch backend batches the
one-token queries together): it says so in `order_requests`, and the runner lays the flat batch
out in that order. Requests that ask for batch invariance always come last, so their rows are one
tail of the batch (the linear layers rely on it too, see `engine/models/batch_invariance.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


@dataclass
class StepInputs:
    """One step's flat batch, requests in the backend's order. Host copies (numpy) are there so a
    backend can plan without reading the device."""

    num_reqs: int
    num_tokens: int
    block_size: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, device: request i owns rows [qsl[i], qsl[i+1])
    query_start_loc_np: np.ndarray
    seq_lens: torch.Tensor  # [num_reqs] int32, device: tokens in the cache after this step
    seq_lens_np: np.ndarray
    num_computed_tokens_np: np.ndarray  # [num_reqs]: tokens in the cache before this step
    positions: torch.Tensor  # [num_tokens] int64, device
    slot_mapping: torch.Tensor  # [num_tokens] int64, device: block * block_size + offset
    # [num_reqs, max_blocks_this_step] int32, device: each request's block ids; entries past its
    # own blocks are stale but valid block ids, to be masked by seq_lens
    block_table: torch.Tensor
    # [num_reqs] bool: the requests whose outputs must not depend on the batch (all at the end);
    # None when no request in the step asks
    batch_invariant_np: np.ndarray | None = None

    @property
    def query_lens_np(self) -> np.ndarray:
        return np.diff(self.query_start_loc_np)


class AttentionBackend(Protocol):
    name: str

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of one layer's K (and of its V) cache tensor."""
        ...

    def order_requests(self, query_lens: np.ndarray, batch_invariant: np.ndarray | None) -> np.ndarray | None:
        """A permutation of the scheduled requests for this step, or None to keep their order;
        the batch-invariant ones (`batch_invariant`: [num_reqs] bool, or None for none) last."""
        ...

    def build_metadata(self, inputs: StepInputs) -> Any:
        ...

    def decode_metadata(self, slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> Any:
        """A step of one query row per sequence from fixed-shape buffers (slot_mapping [rows]
        int64, block_tables [rows, width] int32 at full width, seq_lens [rows] int32), without
        reading them on the host: what a captured decode graph replays (engine/runner/decode_graphs.py)."""
        ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: Any, scale: float,
                kv_written: bool = False) -> torch.Tensor:
        """q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim] (this step's,
        written into the cache here unless `kv_written`). Returns [num_tokens, heads, head_dim]."""
        ...

    def rope_and_write_kv(self, qk: torch.Tensor, v: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                          kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: Any,
                          num_heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """RoPE on qk [num_tokens, heads + kv_heads, head_dim] and this step's K/V written to the
        cache in one fused call: (q, k) rotated, or None where the backend has no such kernel
        (the model then rotates with torch ops and `forward` writes the cache)."""
        return None

    def native_decode_inputs(self, metadata: Any,
                             num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(slot_mapping [rows] int64, block_tables [rows, blocks] int32, seq_lens [rows] int32)
        when every one of the step's `num_tokens` rows is a one-query decode row that the native
        CPU decode kernel attends in place (a whole step then may run as one native call,
        engine/models/native_decode.py); None otherwise."""
        return None
