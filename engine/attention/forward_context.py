"""Per-step attention state, set once by the model runner and read by every layer.

Layers reach it through `get_forward_context()` inside a `forward_context(...)` block, never
through a bare mutable global that outlives the step.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from engine.attention.base import AttentionBackend


@dataclass
class ForwardContext:
    backend: AttentionBackend
    metadata: Any  # what `backend.build_metadata` made for this step
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K, V in the backend's layout


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("forward_context", default=None)


@contextlib.contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def get_forward_context() -> ForwardContext:
    ctx = _current.get()
    assert ctx is not None, "model forward called outside forward_context(...)"
    return ctx
