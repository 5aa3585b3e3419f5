"""Named SSE events (`event: <type>` then `data: <json>`), for the APIs that stream typed events.

OpenAI's Responses API and Anthropic's Messages API stream typed events rather than chat chunks
and no `[DONE]`; the Anthropic SDK reads an event only under its `event:` name. The request is
aborted in the engine when the stream ends before the request did: the client went away
(sse-starlette cancels the generator) or an error ended it.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec
from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from common.messages import GenerateRequest, TextDelta
from server.errors import ApiError
from server.state import ServingState
from server.worker_client import RequestStream

# (event type, JSON body) pairs
Events = AsyncIterator[tuple[str, dict]]


def raise_on_engine_error(delta: TextDelta) -> None:
    if delta.finish_reason == "error":
        raise ApiError(500, f"the engine could not run the request: {delta.error or 'unknown error'}",
                       code="engine_error")


async def start(state: ServingState, request: GenerateRequest) -> RequestStream:
    state.client.check_capacity(1)
    return await state.client.generate(request, 1)


def event_stream(state: ServingState, request_id: str, events: Events,
                 ping: Callable[[], ServerSentEvent] | None = None) -> Response:
    encode = msgspec.json.encode

    async def sse() -> AsyncIterator[ServerSentEvent]:
        try:
            async for kind, body in events:
                yield ServerSentEvent(encode(body).decode(), event=kind)
        finally:
            state.client.abort(request_id)  # a no-op when the request finished

    return EventSourceResponse(sse(), sep="\n", headers={"X-Request-Id": request_id}, ping_message_factory=ping)
