"""POST /v1/messages and POST /v1/messages/count_tokens (Anthropic's Messages API).

A request becomes a chat request (server/anthropic_messages/translate.py), runs as chat
completions do, and comes back as content blocks (server/anthropic_messages/output.py):
non-streamed as one message, streamed as Anthropic's events (`message_start`, the blocks'
`content_block_start` / `_delta` / `_stop`, `message_delta` with the stop reason and usage,
`message_stop`; `ping` while the model is quiet). Every refusal uses Anthropic's error body
(server/anthropic_messages/errors.py); an error after the stream started is an `error` event.
"""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from sse_starlette import ServerSentEvent

from common.messages import TokenizeRequest, Usage
from server.anthropic_messages.errors import ANTHROPIC_ERROR_RESPONSES, AnthropicRoute, anthropic_error_body
from server.anthropic_messages.output import BlockBuilder, stop_reason
from server.anthropic_messages.protocol import CountTokensRequest, MessagesRequest
from server.anthropic_messages.translate import chat_messages, chat_request, chat_tools, renamed, template_thinking
from server.chat import ChatPlan, plan_chat
from server.errors import ApiError
from server.event_stream import event_stream, raise_on_engine_error, start
from server.generation import STREAM_RESPONSE, ChoiceResult, serve_generation
from server.state import ServingState
from server.template_kwargs import template_kwargs
from server.turn_parser import TurnParser

router = APIRouter(route_class=AnthropicRoute)


def _usage(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}


class _Renderer:
    """The non-streamed message (server.generation.Renderer; only `response` is used)."""

    def __init__(self, message_id: str, model: str, plan: ChatPlan):
        self.message_id, self.model, self.plan = message_id, model, plan

    def chunks(self, delta) -> list[dict]:
        raise AssertionError("streamed by server.event_stream")

    def usage_chunk(self, usage: Usage) -> dict:
        raise AssertionError("streamed by server.event_stream")

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        choice = choices[0]
        builder = _builder(self.plan)
        builder.feed(choice.text)
        builder.finish()
        reason, sequence = stop_reason(choice.finish_reason, choice.stop_reason, builder.called)
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": builder.blocks, "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(usage)}


def _builder(plan: ChatPlan) -> BlockBuilder:
    return BlockBuilder(TurnParser(plan.reasoning_parser, plan.tools is not None))


@router.post("/v1/messages", responses={**STREAM_RESPONSE, **ANTHROPIC_ERROR_RESPONSES})
async def create_message(body: MessagesRequest, raw: Request):
    state: ServingState = raw.app.state.serving
    ready = state.check_accepting()
    state.check_model(body.model)
    message_id = f"msg_{uuid.uuid4().hex}"
    messages = chat_messages(body)
    try:
        plan = plan_chat(state, ready, chat_request(body, messages), message_id, messages)
        if not body.stream:
            return await serve_generation(state, raw, plan.request, 1, False, False,
                                          _Renderer(message_id, state.served_model_name, plan))
        stream = await start(state, plan.request)
    except ApiError as err:
        raise renamed(err) from None
    return event_stream(state, message_id, _events(message_id, state.served_model_name, plan, stream),
                        ping=lambda: ServerSentEvent('{"type": "ping"}', event="ping"))


async def _events(message_id: str, model: str, plan: ChatPlan, stream) -> AsyncIterator[tuple[str, dict]]:
    yield "message_start", {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": stream.num_prompt_tokens, "output_tokens": 0}}}
    yield "ping", {"type": "ping"}
    builder = _builder(plan)
    finish: tuple[str | None, object] = (None, None)
    try:
        async for delta in stream:
            raise_on_engine_error(delta)
            for event in builder.feed(delta.text):
                yield event
            if delta.finish_reason is not None:
                finish = (delta.finish_reason, delta.stop_reason)
                for event in builder.finish():
                    yield event
            if delta.usage is not None:
                reason, sequence = stop_reason(*finish, builder.called)
                yield "message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                        "usage": _usage(delta.usage)}
                yield "message_stop", {"type": "message_stop"}
    except ApiError as err:
        yield "error", anthropic_error_body(err.status, err.message)


@router.post("/v1/messages/count_tokens", responses=ANTHROPIC_ERROR_RESPONSES)
async def count_tokens(body: CountTokensRequest, raw: Request):
    state: ServingState = raw.app.state.serving
    state.check_accepting()
    state.check_model(body.model)
    kwargs = template_kwargs(state.config.default_chat_template_kwargs, template_thinking(body), None)
    tools = chat_tools(body) if body.tool_choice is None or body.tool_choice.type != "none" else None
    messages = chat_messages(body)
    try:
        answer = await state.client.call(lambda rid: TokenizeRequest(
            request_id=rid, messages=messages, add_special_tokens=False, tools=tools, chat_template_kwargs=kwargs))
    except ApiError as err:
        raise renamed(err) from None
    return {"input_tokens": len(answer.token_ids)}
