"""The records of a traced request (`"trace": true`), as they cross the process boundaries on
the engine's and the tokenizer worker's deltas (common/messages.py): plain msgspec structs, no
logic, no torch."""
from __future__ import annotations

from typing import Literal

import msgspec


class TraceStop(msgspec.Struct, array_like=True):
    """One stop of a traced request: what went in and came out, and the time spent there.

    Shapes are this request's own part in (batch=1, tokens, features...) order, whatever else
    shared the engine's flat batch; a stop whose data is no tensor (text) has a description
    instead. `ms` is an engine operator's wall time over the whole step (all requests batched
    with this one), or a tokenizer-worker stop's time for this request alone; None where the stop
    is part of another's work (a slice of a merged projection).
    """

    name: str
    input: list[int] | str
    output: list[int] | str
    ms: float | None
    all_layers_ms: float | None = None  # per-layer stops: `ms` summed over every layer
    note: str = ""
    shapes: dict[str, list[int]] = {}  # other shapes of this stop (attention scores, the K/V written)


class TraceChunk(msgspec.Struct, array_like=True):
    """A prefill chunk before the one that completed the prompt (summary only, no stops)."""

    tokens: int
    context_tokens: int
    batch_tokens: int
    batch_requests: int
    runner_ms: float


class TraceStep(msgspec.Struct, kw_only=True):
    """One engine step of a traced request: the prompt's last chunk, or its first decode."""

    phase: Literal["prefill", "decode"]
    tokens: int  # this request's rows in the step
    cached_tokens: int  # its tokens in the KV cache before the step (prefix-cache hits, earlier chunks)
    context_tokens: int  # after the step
    batch_tokens: int  # rows of the whole flat batch
    batch_requests: int
    attention_kernel: str  # how the backend attended this request's rows
    prepare_ms: float  # the runner's input preparation (the whole batch's)
    forward_ms: float
    logits_ms: float
    sample_ms: float
    runner_ms: float
    step_ms: float = 0.0  # the engine's whole step: schedule, runner, update
    stops: list[TraceStop] = []
    earlier_chunks: list[TraceChunk] = []  # prefill only


class EngineTrace(msgspec.Struct, kw_only=True):
    """What the engine knows of a traced request: sent in parts, each on the delta of the step
    it describes (prefill, then decode)."""

    device: str
    dtype: str
    attention_backend: str
    linear_method: str
    batch_invariant: bool
    queue_ms: float | None = None  # reaching the engine -> the start of its first step
    prefill: TraceStep | None = None
    decode: TraceStep | None = None


class RequestTrace(msgspec.Struct, kw_only=True):
    """A traced request's whole record (one choice: index 0), as the server renders it."""

    choice: int
    prompt_stops: list[TraceStop] = []  # chat template, tokenization (the worker's own time)
    engine: EngineTrace | None = None  # None if the choice ended before the engine reported
    detokenize_prefill: TraceStop | None = None  # the token sampled by the prefill step
    detokenize_decode: TraceStop | None = None  # the token of the first decode step
    detokenize_ms: float = 0.0  # every delta of the choice
    detokenized_tokens: int = 0
