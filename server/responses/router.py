"""POST /v1/responses and GET /v1/responses/{id}.

A request becomes a chat request (server/responses/translate.py) with the conversation of its
`previous_response_id` before it, runs as chat completions do, and comes back as output items
(server/responses/output.py): non-streamed as one Response object, streamed as OpenAI's typed
events (`response.created`, `response.in_progress`, the items' events, then `response.completed`
or, cut by max_output_tokens, `response.incomplete`), each with its `sequence_number`. With
`store` (OpenAI's default: true) the response and its conversation are kept in a bounded store
(server/responses/store.py) for the next turn and for GET.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from common.messages import ChatMessage, ChatToolCall, Usage
from server.chat import ChatPlan, plan_chat
from server.errors import ApiError, bad_request
from server.event_stream import event_stream, raise_on_engine_error, start
from server.generation import STREAM_RESPONSE, ChoiceResult, serve_generation
from server.json_body import StrictJSONRoute
from server.responses.output import OutputBuilder, new_id, response_json, usage_json
from server.responses.protocol import ResponsesRequest
from server.responses.store import ResponseStore, StoredResponse
from server.responses.translate import chat_request, input_messages, renamed
from server.state import ServingState
from server.turn_parser import TurnParser

router = APIRouter(route_class=StrictJSONRoute)


def response_store(raw: Request) -> ResponseStore:
    app_state = raw.app.state
    if not hasattr(app_state, "responses"):
        app_state.responses = ResponseStore(app_state.serving.config.max_stored_responses)
    return app_state.responses


class Turn:
    """One /v1/responses call: its request, plan and the bookkeeping for its answer."""

    def __init__(self, body: ResponsesRequest, state: ServingState, store: ResponseStore, plan: ChatPlan,
                 conversation: list[ChatMessage], response_id: str):
        self.body, self.state, self.store, self.plan = body, state, store, plan
        self.conversation = conversation  # what the next turn continues (no instructions)
        self.id = response_id
        self.created_at = int(time.time())
        self.builder = OutputBuilder(TurnParser(plan.reasoning_parser, plan.tools is not None))

    def status(self, finish_reason: str | None) -> tuple[str, str | None]:
        if finish_reason == "length":
            return "incomplete", "max_output_tokens"
        return "completed", None

    def response(self, status: str, usage: Usage | None, reason: str | None = None) -> dict:
        return response_json(self.body, self.id, self.created_at, self.state.served_model_name, status,
                             self.builder.items if status != "in_progress" else [],
                             None if usage is None else usage_json(usage), reason)

    def finished(self, response: dict) -> None:
        if not self.body.store:
            return
        text = "".join(i["content"][0]["text"] for i in self.builder.items if i["type"] == "message")
        calls = [ChatToolCall(i["call_id"], i["name"], i["arguments"]) for i in self.builder.items
                 if i["type"] == "function_call"]
        answer = ChatMessage(role="assistant", content=text, tool_calls=calls or None)
        self.store.put(self.id, StoredResponse(response, [*self.conversation, answer]))


class _Renderer:
    """The non-streamed response (server.generation.Renderer; only `response` is used)."""

    def __init__(self, turn: Turn):
        self.turn = turn

    def chunks(self, delta) -> list[dict]:
        raise AssertionError("streamed by server.event_stream")

    def usage_chunk(self, usage: Usage) -> dict:
        raise AssertionError("streamed by server.event_stream")

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        turn, choice = self.turn, choices[0]
        status, reason = turn.status(choice.finish_reason)
        turn.builder.feed(choice.text)
        turn.builder.finish("incomplete" if status == "incomplete" else "completed")
        response = turn.response(status, usage, reason)
        turn.finished(response)
        return response


@router.post("/v1/responses", responses=STREAM_RESPONSE)
async def create_response(body: ResponsesRequest, raw: Request):
    state: ServingState = raw.app.state.serving
    ready = state.check_accepting()
    state.check_model(body.model)
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options: only allowed when stream is true", "stream_options")
    store = response_store(raw)
    history: list[ChatMessage] = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise ApiError(404, f"previous_response_id: no stored response {body.previous_response_id!r}",
                           "previous_response_id", code="not_found")
        history = previous.conversation
    conversation = history + input_messages(body)
    instructions = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    response_id = new_id("resp")
    try:
        plan = plan_chat(state, ready, chat_request(body, instructions + conversation), response_id,
                         instructions + conversation)
    except ApiError as err:
        raise renamed(err) from None
    turn = Turn(body, state, store, plan, conversation, response_id)
    if not body.stream:
        try:
            return await serve_generation(state, raw, plan.request, 1, False, False, _Renderer(turn))
        except ApiError as err:
            raise renamed(err) from None
    try:
        stream = await start(state, plan.request)
    except ApiError as err:
        raise renamed(err) from None
    return event_stream(state, response_id, _events(turn, stream))


async def _events(turn: Turn, stream) -> AsyncIterator[tuple[str, dict]]:
    sequence = 0

    def numbered(event: dict) -> tuple[str, dict]:
        nonlocal sequence
        event["sequence_number"] = sequence
        sequence += 1
        return event["type"], event

    yield numbered({"type": "response.created", "response": turn.response("in_progress", None)})
    yield numbered({"type": "response.in_progress", "response": turn.response("in_progress", None)})
    try:
        async for delta in stream:
            raise_on_engine_error(delta)
            events = turn.builder.feed(delta.text)
            if delta.finish_reason is not None:
                status, reason = turn.status(delta.finish_reason)
                events += turn.builder.finish("incomplete" if status == "incomplete" else "completed")
            for event in events:
                yield numbered(event)
            if delta.usage is not None:
                response = turn.response(status, delta.usage, reason)
                turn.finished(response)
                yield numbered({"type": f"response.{status}", "response": response})
    except ApiError as err:
        yield numbered({"type": "error", "code": str(err.code or err.status), "message": err.message,
                        "param": err.param})


@router.get("/v1/responses/{response_id}")
async def get_response(raw: Request, response_id: str = Path()):  # noqa: B008 - FastAPI's way
    stored = response_store(raw).get(response_id)
    if stored is None:
        raise ApiError(404, f"no stored response {response_id!r}", "response_id", code="not_found")
    return JSONResponse(stored.response)
