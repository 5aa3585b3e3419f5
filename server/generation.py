"""Serving one generation request, streamed (SSE) or not; the endpoints only format chunks.

Streaming: `data: {json}` events with "\n" separators, then `data: [DONE]`; the first event of a
choice is sent when its first text exists. A client that goes away has its request aborted in
the engine at once: sse-starlette cancels the generator, whose `finally` sends the abort.
Non-streaming: nothing cancels the handler when the client leaves (Starlette cancels streaming
responses only), so generation runs as a task while the handler polls for the disconnect.
A traced request's `trace` (server/trace.py) is a top-level key of the response, or of the last
chunk of a stream: the usage chunk when there is one, else the chunk of the last finish_reason.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from common.messages import (EngineReady, FinishReason, GenerateRequest, PromptEcho, RequestTrace, StopReason,
                             TextDelta, TextLogprob, Usage)
from server.errors import ApiError, bad_request, error_body
from server.state import ServingState
from server.trace import check_trace_allowed, trace_json
from server.worker_client import RequestStream, WorkerClient

# For the OpenAPI document: with "stream": true the answer is an SSE stream, not JSON.
STREAM_RESPONSE: dict[int | str, dict] = {200: {
    "description": "The completion: JSON, or with stream true Server-Sent Events (`data: {json}` chunks, "
                   "then `data: [DONE]`)",
    "content": {"text/event-stream": {"schema": {  # one event
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string", "description": "a JSON chunk; the last event is [DONE]"}}}}}}}
DISCONNECT_POLL_S = 0.1
CLIENT_CLOSED_REQUEST = 499  # nginx's code; nobody reads it, the client is gone


@dataclass
class ChoiceResult:
    index: int
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TextLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: StopReason | None = None
    prompt: PromptEcho | None = None  # echo / prompt_logprobs

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


class Renderer(Protocol):
    """One endpoint's JSON shapes."""

    def chunks(self, delta: TextDelta) -> list[dict]: ...
    def usage_chunk(self, usage: Usage) -> dict: ...
    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict: ...


@dataclass(frozen=True)
class ResponseIds:
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseIds:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)


def usage_dict(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def admit(state: ServingState, body) -> EngineReady:
    """The checks every generation endpoint makes first: the engine is ready, the model is
    ours, stream_options only comes with stream, and a trace only where tracing is on."""
    ready = state.check_accepting()
    state.check_model(body.model)
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options: only allowed when stream is true", "stream_options")
    check_trace_allowed(body, state.config)
    return ready


async def serve_generation(state: ServingState, raw: Request, request: GenerateRequest, num_choices: int,
                           stream: bool, include_usage: bool, renderer: Renderer) -> Response:
    client = state.client
    client.check_capacity(num_choices)
    request_stream = await client.generate(request, num_choices)
    lora = request.sampling_params.lora
    if lora is not None and state.lora is not None:  # the adapters in flight, for vllm:lora_requests_info
        state.lora.in_flight[lora.name] += 1
    if stream:
        events = _sse_events(client, request_stream, renderer, include_usage)
        if lora is not None and state.lora is not None:
            events = _counted(events, state.lora.in_flight, lora.name)
        return EventSourceResponse(events, sep="\n", headers={"X-Request-Id": request.request_id})
    collecting = asyncio.ensure_future(_collect(request_stream, num_choices))
    try:
        while True:
            done, _ = await asyncio.wait({collecting}, timeout=DISCONNECT_POLL_S)
            if done:
                choices, usage, trace = collecting.result()
                response = renderer.response(choices, usage)
                if trace is not None:
                    response["trace"] = trace_json(trace)
                return JSONResponse(response)
            if await raw.is_disconnected():
                return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        if not collecting.done():
            collecting.cancel()
        client.abort(request.request_id)  # a no-op when it finished
        if lora is not None and state.lora is not None:
            state.lora.in_flight[lora.name] -= 1


async def _counted(events: AsyncIterator[str], in_flight: Counter[str], name: str) -> AsyncIterator[str]:
    """The stream's events, with the adapter's count of requests in flight taken back at its end."""
    try:
        async for event in events:
            yield event
    finally:
        in_flight[name] -= 1


async def _collect(stream: RequestStream, num_choices: int) -> tuple[list[ChoiceResult], Usage,
                                                                     RequestTrace | None]:
    choices = [ChoiceResult(i) for i in range(num_choices)]
    async for delta in stream:
        _raise_on_engine_error(delta)
        choice = choices[delta.index]
        choice.text_parts.append(delta.text)
        if delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
        if delta.prompt is not None:
            choice.prompt = delta.prompt
        if delta.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = delta.finish_reason, delta.stop_reason
        if delta.usage is not None:
            return choices, delta.usage, delta.trace
    raise AssertionError("the stream ended without usage")


def _raise_on_engine_error(delta: TextDelta) -> None:
    if delta.finish_reason == "error":
        raise ApiError(500, f"the engine could not run the request: {delta.error or 'unknown error'}",
                       code="engine_error")


async def _sse_events(client: WorkerClient, stream: RequestStream, renderer: Renderer,
                      include_usage: bool) -> AsyncIterator[str]:
    encode = msgspec.json.encode
    finished = False
    try:
        async for delta in stream:
            _raise_on_engine_error(delta)
            chunks = renderer.chunks(delta)
            if delta.usage is not None:
                if include_usage:
                    chunks.append(renderer.usage_chunk(delta.usage))
                if delta.trace is not None:
                    chunks[-1]["trace"] = trace_json(delta.trace)
            for chunk in chunks:
                yield encode(chunk).decode()
            if delta.usage is not None:
                finished = True
    except ApiError as err:
        yield encode(error_body(err.status, err.message, err.param, err.code)).decode()
    finally:
        if not finished:
            client.abort(stream.request_id)
    yield "[DONE]"
