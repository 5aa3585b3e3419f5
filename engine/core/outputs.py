"""The plain structs that pass between the scheduler and the model runner, once per step.

`Scheduler.schedule()` -> SchedulerOutput -> `ModelRunner.execute()` -> RunnerOutput ->
`Scheduler.update()`. A request's data crosses once, when it is first scheduled (or resumed
after a preemption); after that only diffs do (new block ids, progress). Nothing here holds a
`Request`, so the runner could live in another process or on several ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common.messages import EngineTrace, SamplingParams
from engine.structured.manager import GrammarBitmask


@dataclass
class NewRequestData:
    """A request that gets a batch row this step: new, or resumed after a preemption."""

    request_id: str
    token_ids: list[int]  # prompt, then the outputs so far (a resumed request recomputes them)
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]  # every block it holds
    num_computed_tokens: int  # tokens already in the KV cache (prefix-cache hits)


@dataclass
class CachedRequestData:
    """A request that already has a row and runs again this step."""

    request_id: str
    new_block_ids: list[int]  # appended to its block table
    num_computed_tokens: int  # before this step


@dataclass
class SchedulerOutput:
    new_requests: list[NewRequestData]
    cached_requests: list[CachedRequestData]
    # request id -> tokens to compute this step, every scheduled request (no order implied: the
    # attention backend orders the batch rows as it needs)
    num_scheduled_tokens: dict[str, int]
    # since the previous step: these lose their rows (finished or aborted: their state too)
    finished_request_ids: set[str] = field(default_factory=set)
    preempted_request_ids: set[str] = field(default_factory=set)
    # request id -> draft tokens scheduled after its last sampled token (speculative decoding);
    # its num_scheduled_tokens is 1 + len(draft), and every one of those positions is sampled
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # structured outputs: the allowed next tokens of the constrained requests that sample
    grammar: GrammarBitmask | None = None

    @property
    def has_work_for_runner(self) -> bool:
        return bool(self.num_scheduled_tokens or self.finished_request_ids or self.preempted_request_ids)


@dataclass
class PromptLogprobsChunk:
    """One request's prompt logprobs from one step (engine/runner/prompt_logprobs.py): the
    positions first_position, first_position + 1, ..., each predicting the prompt token after it."""

    first_position: int
    token_ids: list[list[int]]  # per position: [the prompt token, then the k best]
    logprobs: list[list[float]]
    ranks: list[int]  # per position: the prompt token's rank (1: the best)


@dataclass
class RunnerOutput:
    """What one forward pass sampled, per request that reached the end of its known tokens."""

    request_ids: list[str]
    # per request: one token, or with a draft the accepted draft tokens and one more
    sampled_token_ids: list[list[int]]
    # Per request and sampled token: [sampled id, then the top-k ids] and their logprobs (raw
    # model distribution); None for requests that asked for none.
    logprob_token_ids: list[list[list[int]] | None] | None = None
    logprobs: list[list[list[float]] | None] | None = None
    # Traced requests recorded in full this step (engine/trace): request id -> that step's record
    traces: dict[str, EngineTrace] | None = None
    # Requests that asked for prompt logprobs and had prompt positions in the step, sampled or not
    prompt_logprobs: dict[str, PromptLogprobsChunk] | None = None

    @classmethod
    def empty(cls) -> RunnerOutput:
        return cls([], [])
