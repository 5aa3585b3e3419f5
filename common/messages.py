"""Every type that crosses a process boundary, as plain msgspec structs.

No logic and no torch here: the server, the tokenizer worker and the engine all import this
module, and the wire format (msgpack) is derived from these definitions. Grouped by destination.
"""
from __future__ import annotations

from typing import Literal

import msgspec

# the trace records ride on the deltas below (common/trace_messages.py)
from common.trace_messages import EngineTrace, RequestTrace, TraceChunk, TraceStep, TraceStop  # noqa: F401

# How a sequence ended (vLLM's names): "stop" an EOS, stop token or stop string; "length"
# max_tokens or max_model_len; "abort" the client left; "error" the engine refused it.
FinishReason = Literal["stop", "length", "abort", "error"]
# What stopped it: a stop token id (the engine's) or a stop string (the tokenizer worker's).
StopReason = int | str


class StructuredOutputs(msgspec.Struct, frozen=True, array_like=True):
    """A grammar the output must follow (compiled by `common.structured_outputs`).

    kind "json": `spec` is a JSON schema (text); "json_object": any JSON object; "regex": a regular
    expression; "choice": a JSON list of the allowed strings; "grammar": EBNF (xgrammar's dialect,
    GBNF-like); "structural_tag": an xgrammar structural tag (JSON), e.g. the tool-call format.
    `param` names the request field it came from, for errors.
    """

    kind: Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]
    spec: str
    param: str = "structured_outputs"


class LoraRequest(msgspec.Struct, frozen=True, array_like=True):
    """The LoRA adapter a request runs with (vLLM's LoRARequest): its served name, an id unique to
    this load of it (a reload gets a new one, so its KV and weights never mix with the old), and its
    PEFT folder, which the engine reads the first time it sees the id."""

    name: str
    id: int
    path: str


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a request asks of the sampler and the stop rules (token level).

    Validation lives in `common.validation`; defaults here mean "off".
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
    # None: none; k >= 0: each prompt token's logprob (but the first's) plus k alternatives
    prompt_logprobs: int | None = None
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    structured_outputs: StructuredOutputs | None = None  # None: unconstrained
    # Logits bitwise independent of the batch the request lands in (engine/attention/batch_invariant.py)
    batch_invariant: bool = False
    # Report this request's way through the server: shapes and times per stop (RequestTrace)
    trace: bool = False
    # The LoRA adapter to run with (engine/lora); None: the base model
    lora: LoraRequest | None = None
    # Text-level fields, used by the tokenizer worker only.
    stop: list[str] = []
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    echo: bool = False  # a choice's first delta carries its prompt (PromptEcho)


# ---- to the engine ----------------------------------------------------------------------


class EngineRequest(msgspec.Struct, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


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
    finish_reason: FinishReason | None = None
    stop_reason: StopReason | None = None  # the engine knows no stop strings: a stop token id
    # Prompt tokens found in the prefix cache; sent on a request's first delta (None after it).
    num_cached_tokens: int | None = None
    error: str | None = None  # with finish_reason "error": why the engine refused the request
    trace: EngineTrace | None = None  # a traced request: the part recorded in this step
    # With prompt_logprobs, on the first delta: per prompt token but the first, [it, then the k best],
    # and its rank
    prompt_logprobs: list[list[TokenLogprob]] | None = None
    prompt_logprob_ranks: list[int] | None = None


class SpecDecodeStats(msgspec.Struct, array_like=True):
    """Speculative decoding since the last EngineStats (counter increments, vLLM's metrics)."""

    num_drafts: int  # verifications of a draft
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]  # [num_speculative_tokens]: drafts accepted at least this far


class RooflineStats(msgspec.Struct, array_like=True):
    """The engine's steps since the last EngineStats against the machine's roofs (`engine.roofline`)."""

    # Per step: the model's bytes / (wall seconds * bandwidth), and FLOPs / (wall seconds * peak FLOP/s)
    bandwidth_utilization: list[float]
    compute_utilization: list[float]
    # Operator -> its time lower bound, max(FLOPs / peak, bytes / bandwidth), summed over the steps
    operator_lower_bound_s: dict[str, float]
    wall_s: float  # the steps' wall time, summed


class EngineStats(msgspec.Struct):
    """Scheduler and cache gauges with what accumulated since the last EngineStats: sent when
    something changed, at most every `engine_process.STATS_INTERVAL_S` while the engine is busy
    and at once when it runs out of work (inside EngineOutputs / TextOutputs, so untagged)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    # Seconds from arrival to first schedule, one per request that left the queue since the
    # last EngineStats (observations for a histogram, not a gauge).
    queue_times: list[float] = []
    spec_decode: SpecDecodeStats | None = None
    roofline: RooflineStats | None = None


class EngineOutputs(msgspec.Struct, tag=True):
    deltas: list[TokenDelta]
    stats: EngineStats | None = None


class EngineReady(msgspec.Struct, tag=True, kw_only=True):
    """The engine is loaded: its limits, and what the model folder says about generation."""

    num_kv_tokens: int
    max_model_len: int
    vocab_size: int
    device: str
    dtype: str
    model_dir: str
    eos_token_ids: list[int]
    generation_defaults: dict[str, int | float]  # SamplingParams field -> the model's default


class ProcessError(msgspec.Struct, tag=True):
    process: str
    message: str


# EngineReady and ProcessError travel on: engine -> tokenizer worker -> server. AbortRequest is
# also what the server sends the tokenizer worker (with the server's request ids).

# ---- to the tokenizer worker (from the server) -------------------------------------------


class ChatToolCall(msgspec.Struct, array_like=True):
    """A call an assistant turn made (from the conversation sent back to us)."""

    id: str
    name: str
    arguments: str  # JSON text


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str  # "system" | "user" | "assistant" | "tool" (checked by the server)
    content: str  # text parts already joined by the server
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = None  # assistant turns
    tool_call_id: str | None = None  # tool turns: the call answered


class GenerateRequest(msgspec.Struct, tag=True, kw_only=True):
    """One HTTP generation request: a chat conversation, or completion prompts (text or ids).

    The worker runs len(prompts) * n choices (1 * n for chat); choice index = prompt * n + i.
    """

    request_id: str
    sampling_params: SamplingParams
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    # Chat only: the tools to show the model (OpenAI's tool objects); None: no tools
    tools: list[dict] | None = None
    # Chat only: extra variables for the chat template (enable_thinking, reasoning_effort, ...)
    chat_template_kwargs: dict[str, object] | None = None
    prompts: list[str | list[int]] = []
    continue_final_message: bool = False  # chat: the last message stays open for the model to continue


class TokenizeRequest(msgspec.Struct, tag=True, kw_only=True):
    request_id: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    continue_final_message: bool = False
    tools: list[dict] | None = None  # chat: the tools shown to the model, as in GenerateRequest
    chat_template_kwargs: dict[str, object] | None = None


class DetokenizeRequest(msgspec.Struct, tag=True):
    request_id: str
    token_ids: list[int]


# ---- to the server (from the tokenizer worker) -------------------------------------------


class PromptAccepted(msgspec.Struct, tag=True):
    """The prompts are tokenized, valid, and on their way to the engine."""

    request_id: str
    num_prompt_tokens: int


class RequestRejected(msgspec.Struct, tag=True):
    """A request the worker could not take (bad input: status 400), with the field to blame."""

    request_id: str
    message: str
    param: str | None = None
    status: int = 400


class TextLogprob(msgspec.Struct, array_like=True):
    """One token's logprob in text form: the sampled token, with its top alternatives in `top`
    (each a TextLogprob whose own `top` is empty)."""

    token: str  # the token decoded on its own (may be a partial character)
    token_bytes: list[int]  # its exact bytes
    logprob: float
    top: list[TextLogprob] = []


class PromptToken(msgspec.Struct, array_like=True):
    """A prompt token for echo and prompt logprobs: its text, and its logprob and rank (None for the
    first token, which nothing predicts), with the top alternatives (each a PromptToken whose rank
    is its place and whose own `top` is empty)."""

    token_id: int
    token: str  # decoded on its own
    logprob: float | None = None
    rank: int | None = None
    top: list[PromptToken] = []


class PromptEcho(msgspec.Struct, array_like=True):
    """A choice's prompt, on its first delta, for echo and prompt_logprobs."""

    text: str  # the request's prompt text, or its token ids decoded
    tokens: list[PromptToken] | None = None  # with prompt logprobs: every prompt token


class Usage(msgspec.Struct, array_like=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class TextDelta(msgspec.Struct, array_like=True):
    """New text of one choice. Sent only when there is text, logprobs or a finish."""

    request_id: str
    index: int  # the choice
    text: str
    num_new_tokens: int  # output tokens this delta accounts for
    finish_reason: FinishReason | None = None
    stop_reason: StopReason | None = None
    logprobs: list[TextLogprob] | None = None
    usage: Usage | None = None  # on the delta that ends the whole request, only
    error: str | None = None  # with finish_reason "error"
    # On a choice's last delta: its streamed text differed from a full decode of its tokens
    # (the tokenizer worker's self-check, `tokenizer_worker.stream_check`).
    detokenize_mismatch: bool = False
    trace: RequestTrace | None = None  # a traced request: on its last delta (the one with usage)
    prompt: PromptEcho | None = None  # echo / prompt_logprobs: on the choice's first delta


class TextOutputs(msgspec.Struct, tag=True):
    """What one engine step produced, as text; `stats` passed through from the engine."""

    deltas: list[TextDelta]
    stats: EngineStats | None = None


class TokenizeResponse(msgspec.Struct, tag=True):
    request_id: str
    token_ids: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(msgspec.Struct, tag=True):
    request_id: str
    text: str


# ---- what each socket carries (for the msgpack decoders) ---------------------------------

ToEngine = EngineRequest | AbortRequest
FromEngine = EngineOutputs | EngineReady | ProcessError
ToTokenizerWorker = GenerateRequest | AbortRequest | TokenizeRequest | DetokenizeRequest
ToServer = (TextOutputs | PromptAccepted | RequestRejected | TokenizeResponse | DetokenizeResponse
            | EngineReady | ProcessError)
