"""Every type that crosses a process boundary, as plain msgspec structs.

No logic and no torch here: the server, the tokenizer worker and the engine all import this
module, and the wire format (msgpack) is derived from these definitions. Grouped by destination.
"""
from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a request asks of the sampler and the stop rules (token level).

    Validation lives in `engine.sampling_validation`; defaults here mean "off".
    """

    n: int = 1
    max_tokens: int | None = None  # None: up to max_model_len
    min_tokens: int = 0
    temperature: float = 1.0  # 0 selects the greedy fast path
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF/vLLM meaning: over prompt and output tokens
    presence_penalty: float = 0.0  # OpenAI meaning: over output tokens
    frequency_penalty: float = 0.0  # OpenAI meaning: over output tokens
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    logprobs: int | None = None  # None: none; k >= 0: the sampled token plus k alternatives
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    # Text-level fields, used by the tokenizer worker only.
    stop: list[str] = []
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


# ---- to the engine ----------------------------------------------------------------------


class EngineRequest(msgspec.Struct, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0


class AbortRequest(msgspec.Struct, tag=True):
    request_ids: list[str]


# ---- from the engine --------------------------------------------------------------------


class TokenLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float


class TokenDelta(msgspec.Struct, array_like=True):
    """New tokens of one request in one engine step."""

    request_id: str
    new_token_ids: list[int]
    # One entry per new token when logprobs were asked: the sampled token first, then the top-k.
    logprobs: list[list[TokenLogprob]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | None = None  # the stop token id that ended it, if any
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0


class EngineStats(msgspec.Struct, tag=True):
    """Scheduler and cache gauges, sent once per step that changed something."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int


class EngineOutputs(msgspec.Struct, tag=True):
    deltas: list[TokenDelta]
    stats: EngineStats | None = None


class EngineReady(msgspec.Struct, tag=True):
    num_kv_tokens: int
    max_model_len: int
    device: str
    dtype: str


class ProcessError(msgspec.Struct, tag=True):
    process: str
    message: str
