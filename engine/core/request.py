"""The scheduler's state for one sequence: its tokens, progress, blocks, and why it stopped."""
from __future__ import annotations

import enum
import time

from typing import TYPE_CHECKING

from common.messages import FinishReason, SamplingParams, TokenLogprob

if TYPE_CHECKING:
    from engine.core.outputs import PromptLogprobsChunk
    from engine.structured.manager import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # new, or preempted and waiting to recompute its tokens
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """`num_computed_tokens` chases `num_tokens`: what the KV cache holds vs what exists."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, max_tokens: int):
        assert prompt_token_ids, "empty prompt"
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)  # the prompt, then every output token
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens  # resolved against max_model_len at admission
        self.arrival_time = time.time()  # reaching the engine: queue time runs from here
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first schedule
        self.num_preemptions = 0
        self.scheduled_once = False  # left the waiting queue at least once (queue-time metric)
        self.block_ids: list[int] = []
        # Prefix-cache bookkeeping: hashes of the full blocks so far, in order (extended as they
        # fill), and how many leading blocks were offered to the cache already.
        self.block_hashes: list[bytes] = []
        self.num_registered_blocks = 0
        self.stop_token_ids: set[int] = set()  # the ids that end it (set by the scheduler)
        # Speculative decoding: this step's draft (scheduled after the last sampled token, not
        # part of token_ids), and how well its drafts have been accepted lately.
        self.spec_token_ids: list[int] = []
        self.spec_acceptance = 1.0
        self.spec_resume_step = 0
        # Async scheduling: output tokens that launched steps sample but the host has not read
        # yet (one per step in flight that samples it). The next step is scheduled as if they
        # were known: the runner finds them in its device token table.
        self.num_in_flight = 0
        # Structured outputs: its grammar, None if unconstrained
        self.grammar: RequestGrammar | None = None
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | None = None
        self.error: str | None = None  # with finish_reason "error"
        # Prompt logprobs gathered chunk by chunk (positions 0 .. P - 2), sent with the first token
        self.prompt_logprobs: list[list[TokenLogprob]] = []
        self.prompt_logprob_ranks: list[int] = []

    def add_prompt_logprobs(self, chunk: PromptLogprobsChunk) -> None:
        """A step's positions; those already held (recomputed after a preemption) are skipped."""
        skip = len(self.prompt_logprobs) - chunk.first_position
        assert skip >= 0, "prompt positions arrive in order"
        for ids, values in zip(chunk.token_ids[skip:], chunk.logprobs[skip:], strict=True):
            self.prompt_logprobs.append([TokenLogprob(t, v) for t, v in zip(ids, values, strict=True)])
        self.prompt_logprob_ranks.extend(chunk.ranks[skip:])

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens_with_pending(self) -> int:
        """The known tokens, this step's draft, and the ids that steps in flight will sample."""
        return len(self.token_ids) + len(self.spec_token_ids) + self.num_in_flight

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, computed={self.num_computed_tokens}/"
                f"{self.num_tokens}, blocks={len(self.block_ids)})")
