"""POST /v1/chat/completions: request checks, then chunks and responses in OpenAI's shapes."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
from fastapi import APIRouter, Request

from common.messages import ChatMessage, ChatToolCall, GenerateRequest, SamplingParams, TextDelta, TextLogprob, Usage
from server.errors import bad_request
from server.generation import (STREAM_RESPONSE, ChoiceResult, Renderer, ResponseIds, admit, serve_generation,
                               usage_dict)
from server.json_body import StrictJSONRoute
from server.prompt_logprobs import WithPromptLogprobs
from server.protocol import ChatCompletionRequest
from server.sampling import chat_sampling_params
from server.structured import requested_grammar
from server.reasoning import ReasoningParser, split_reasoning
from server.reasoning_grammar import after_reasoning
from server.template_kwargs import template_kwargs, thinking_enabled
from server.tool_choice import ToolPlan, plan_tools
from server.tool_parser import ToolCall, ToolCallParser

router = APIRouter(route_class=StrictJSONRoute)


@router.post("/v1/chat/completions", responses=STREAM_RESPONSE)
async def chat_completions(body: ChatCompletionRequest, raw: Request):
    state = raw.app.state.serving
    ready = admit(state, body)
    ids = ResponseIds.new("chatcmpl", state.served_model_name)
    plan = plan_chat(state, ready, body, ids.id)
    params = plan.request.sampling_params
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer: Renderer = ChatRenderer(ids, include_usage, params.logprobs is not None,
                                      None if plan.tools is None else plan.tools.mode, plan.reasoning_parser,
                                      body.include_reasoning)
    if body.prompt_logprobs is not None:
        renderer = WithPromptLogprobs(renderer, body.prompt_logprobs, per_choice=False)
    return await serve_generation(state, raw, plan.request, params.n, bool(body.stream), include_usage, renderer)


@dataclass
class ChatPlan:
    """A checked chat request, ready to be sent: what /v1/responses and /v1/messages build too."""

    request: GenerateRequest
    tools: ToolPlan | None
    reasoning_parser: str | None  # the server's, when this request's template lets the model think


def prepare_chat(state, body: ChatCompletionRequest,
                 ready) -> tuple[SamplingParams, list[ChatMessage], ToolPlan | None]:
    """The checks and conversions a chat request goes through before it is sent (also for its render)."""
    plan = plan_chat(state, ready, body, "")
    assert plan.request.messages is not None
    return plan.request.sampling_params, plan.request.messages, plan.tools


def plan_chat(state, ready, body: ChatCompletionRequest, request_id: str,
              messages: list[ChatMessage] | None = None) -> ChatPlan:
    """The checks and the GenerateRequest of a chat request (`messages`: already converted)."""
    if body.continue_final_message and body.add_generation_prompt:
        raise bad_request("continue_final_message: cannot be true together with add_generation_prompt (set "
                          "add_generation_prompt to false)", "continue_final_message")
    tools = plan_tools(body)
    grammar = requested_grammar(body)
    if tools is not None and grammar is not None:
        raise bad_request("response_format: cannot be combined with tools unless tool_choice is none",
                          "response_format" if body.response_format is not None else "structured_outputs")
    if tools is not None:
        grammar = tools.grammar
    kwargs = template_kwargs(state.config.default_chat_template_kwargs, body.chat_template_kwargs,
                             body.reasoning_effort)
    parser = state.config.reasoning_parser
    if parser is not None and not thinking_enabled(kwargs):
        parser = None  # the template closed the think block in the prompt: all of the output is answer
    if grammar is not None and parser is not None:
        grammar = after_reasoning(grammar, parser)
    params = chat_sampling_params(body, state.generation_defaults, ready.vocab_size, ready.max_model_len, grammar)
    request = GenerateRequest(request_id=request_id, sampling_params=params,
                              messages=to_chat_messages(body.messages) if messages is None else messages,
                              add_generation_prompt=body.add_generation_prompt,
                              tools=None if tools is None else tools.tools, chat_template_kwargs=kwargs,
                              continue_final_message=body.continue_final_message)
    if state.lora is not None:  # the adapter `model` names, for every endpoint that plans a chat
        request = state.lora.with_lora(body.model, request)
    return ChatPlan(request, tools, parser)


def chat_logprobs(entries: list[TextLogprob]) -> dict:
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.token_bytes,
                         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.token_bytes}
                                          for t in e.top]} for e in entries]}


class ChatRenderer:
    """With tools offered, each choice's text goes through a ToolCallParser: calls come out as
    `tool_calls` (streamed as OpenAI's deltas: the first with index, id, type and name, then
    argument fragments), the rest as content. Content that is only whitespace beside calls (the
    newline between two) is no content: null in the answer, not streamed. A choice that called
    ends with "tool_calls", except under a named tool_choice, where OpenAI and vLLM say "stop"."""

    def __init__(self, ids: ResponseIds, include_usage: bool, want_logprobs: bool, tool_mode: str | None = None,
                 reasoning_parser: str | None = None, include_reasoning: bool = True):
        self.ids = ids
        self.reasoning_parser = reasoning_parser  # reasoning goes to reasoning_content (vLLM's field)
        self.include_reasoning = include_reasoning  # false: the reasoning is split off and left out
        self.reasoners: dict[int, ReasoningParser] = {}
        self.include_usage = include_usage
        self.want_logprobs = want_logprobs
        self.tool_mode = tool_mode  # None: no tools offered; else server.tool_choice.ToolPlan.mode
        self.started: set[int] = set()  # choices whose role chunk went out
        self.parsers: dict[int, ToolCallParser] = {}
        self.held_space: dict[int, str] = {}  # per choice: whitespace-only content not sent yet
        self.sent_text: set[int] = set()  # choices that sent content other than whitespace

    @property
    def parse_tools(self) -> bool:
        return self.tool_mode is not None

    def _finish_reason(self, reason, called: bool):
        return "tool_calls" if called and reason == "stop" and self.tool_mode != "named" else reason

    def _chunk(self, choice: dict) -> dict:
        chunk = {"id": self.ids.id, "object": "chat.completion.chunk", "created": self.ids.created,
                 "model": self.ids.model, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI's shape: null on every chunk but the usage chunk
        return chunk

    def chunks(self, delta: TextDelta) -> list[dict]:
        i = delta.index
        out = []
        if i not in self.started:
            self.started.add(i)
            out.append(self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}))
        logprobs = chat_logprobs(delta.logprobs) if delta.logprobs else None
        if self.reasoning_parser is not None:
            reasoner = self.reasoners.setdefault(i, ReasoningParser(self.reasoning_parser))
            pieces = reasoner.feed(delta.text) + (reasoner.finish() if delta.finish_reason is not None else [])
            reasoning = "".join(v for k, v in pieces if k == "reasoning")
            if reasoning and self.include_reasoning:
                out.append(self._chunk({"index": i, "delta": {"reasoning_content": reasoning}, "logprobs": logprobs,
                                        "finish_reason": None}))
                logprobs = None
            delta = msgspec.structs.replace(delta, text="".join(v for k, v in pieces if k == "content"))
        if not self.parse_tools:
            if delta.text or logprobs:
                out.append(self._chunk({"index": i, "delta": {"content": delta.text}, "logprobs": logprobs,
                                        "finish_reason": None}))
        else:
            out += self._tool_chunks(i, delta, logprobs)
        if delta.finish_reason is not None:
            reason = delta.finish_reason
            if self.parse_tools:
                reason = self._finish_reason(reason, bool(self.parsers[i].calls))
            out.append(self._chunk({"index": i, "delta": {}, "logprobs": None, "finish_reason": reason,
                                    "stop_reason": delta.stop_reason}))
        return out

    def _tool_chunks(self, i: int, delta: TextDelta, logprobs: dict | None) -> list[dict]:
        parser = self.parsers.setdefault(i, ToolCallParser())
        parsed = parser.feed(delta.text)
        if delta.finish_reason is not None:
            parsed.events += parser.finish().events
        out = []
        for kind, value in self._hold_whitespace(i, parsed.events, delta.finish_reason is not None,
                                                 bool(parser.calls)):
            if kind == "content":
                body: dict = {"content": value}
            elif kind == "call":
                assert isinstance(value, ToolCall)
                body = {"tool_calls": [{"index": value.index, "id": value.id, "type": "function",
                                        "function": {"name": value.name, "arguments": ""}}]}
            else:
                index, fragment = value  # type: ignore[misc]
                body = {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
            out.append(self._chunk({"index": i, "delta": body, "logprobs": logprobs, "finish_reason": None}))
            logprobs = None  # the step's logprobs go with its first chunk
        if logprobs:
            out.append(self._chunk({"index": i, "delta": {"content": ""}, "logprobs": logprobs,
                                    "finish_reason": None}))
        return out

    def _hold_whitespace(self, i: int, events: list, finished: bool, called: bool) -> list:
        """The events to stream: content that is only whitespace waits until text follows it
        (then both go), or the end (sent if no call was made, dropped otherwise)."""
        out = []
        for kind, value in events:
            if kind == "content" and i not in self.sent_text:
                if not value.strip():
                    self.held_space[i] = self.held_space.get(i, "") + value
                    continue
                value = self.held_space.pop(i, "") + value
                self.sent_text.add(i)
            out.append((kind, value))
        if finished and i in self.held_space:
            held = self.held_space.pop(i)
            if not called:
                out.append(("content", held))
        return out

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "chat.completion.chunk", "created": self.ids.created,
                "model": self.ids.model, "choices": [], "usage": usage_dict(usage)}

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "chat.completion", "created": self.ids.created, "model": self.ids.model,
                "choices": [self._choice(c) for c in choices], "usage": usage_dict(usage)}

    def _choice(self, c: ChoiceResult) -> dict:
        text = c.text
        message: dict = {"role": "assistant", "content": text}
        if self.reasoning_parser is not None:
            reasoning, text = split_reasoning(self.reasoning_parser, text)
            if self.include_reasoning:
                message["reasoning_content"] = reasoning
            message["content"] = text
        reason = c.finish_reason
        if self.parse_tools:
            parser = ToolCallParser()
            parsed = parser.feed(text)
            content = parsed.content + parser.finish().content
            message["content"] = content if content.strip() or not parser.calls else None
            if parser.calls:  # OpenAI leaves the field out when there are none
                message["tool_calls"] = [{"id": call.id, "type": "function",
                                          "function": {"name": call.name, "arguments": call.arguments}}
                                         for call in parser.calls]
                reason = self._finish_reason(reason, True)
        return {"index": c.index, "message": message,
                "logprobs": chat_logprobs(c.logprobs) if self.want_logprobs else None,
                "finish_reason": reason, "stop_reason": c.stop_reason}


def to_chat_messages(messages) -> list[ChatMessage]:
    """Request messages as the worker's ChatMessage structs (text content joined)."""
    # "developer" is OpenAI's newer name for the system role; chat templates know "system".
    out = []
    for m in messages:
        calls = getattr(m, "tool_calls", None)  # assistant turns
        out.append(ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text(), name=m.name,
                               tool_calls=None if calls is None else [
                                   ChatToolCall(c.id, c.function.name, c.function.arguments) for c in calls],
                               tool_call_id=getattr(m, "tool_call_id", None)))
    return out


def message_dict(m: ChatMessage) -> dict:
    """A ChatMessage as a chat completions request message (what the other APIs translate to)."""
    entry: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        entry["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in m.tool_calls]
        if not m.content:
            entry["content"] = None
    if m.tool_call_id is not None:
        entry["tool_call_id"] = m.tool_call_id
    return entry
