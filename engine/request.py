"""The engine's state for one sequence: tokens, progress, blocks, and why it stopped."""
from __future__ import annotations

import enum

import torch

from common.messages import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, will recompute its tokens
    FINISHED = "finished"


class Request:
    """`num_computed_tokens` chases `num_tokens`: what the KV cache holds vs what exists."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 max_tokens: int, arrival_time: float, generator: torch.Generator | None):
        assert prompt_token_ids, "empty prompt"
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids = list(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens  # resolved against max_model_len at admission
        self.arrival_time = arrival_time
        self.generator = generator  # per-request RNG when the request carries a seed
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first schedule
        self.block_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, computed={self.num_computed_tokens}/"
                f"{self.num_tokens}, blocks={len(self.block_ids)})")
