"""The step's LoRA token groups, set by the model runner around the forward pass and read by every
linear layer that carries adapter slots (never a global that outlives the step)."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class StepLora:
    # (resident slot, the flat batch's rows that run with it: None = every row); base rows in none
    groups: list[tuple[int, torch.Tensor | None]]
    # per flat-batch row its slot, -1 for the base model (the Triton kernels' index)
    token_slots: torch.Tensor


_current: contextvars.ContextVar[StepLora | None] = contextvars.ContextVar("step_lora", default=None)


@contextlib.contextmanager
def lora_context(step: StepLora | None) -> Iterator[None]:
    token = _current.set(step)
    try:
        yield
    finally:
        _current.reset(token)


def current_lora() -> StepLora | None:
    """This step's groups, or None when no row of it runs an adapter."""
    return _current.get()
