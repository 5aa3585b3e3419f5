"""A Messages API request as the chat request the rest of the server runs.

`system` leads as a system message (its text blocks joined). In a user turn, each `tool_result`
becomes a tool message answering its `tool_use_id` and the text blocks one user message after
them; in an assistant turn, the text is the content and each `tool_use` a call (its `input` as
JSON arguments). Tools map to function tools (`input_schema` -> parameters), `tool_choice`
auto / any / tool / none to auto / required / a named function / none (with
`disable_parallel_tool_use` as parallel_tool_calls false), `max_tokens` -> max_completion_tokens,
`stop_sequences` -> stop, and `thinking` (enabled or disabled) to the template's
`enable_thinking`. A refusal of the chat checks names the field as this API calls it.
"""
from __future__ import annotations

import json

from pydantic import ValidationError

from common.messages import ChatMessage, ChatToolCall
from server.anthropic_messages.protocol import (CountTokensRequest, MessagesRequest, TextBlock, ThinkingDisabled,
                                                ThinkingEnabled, ToolResultBlock, ToolUseBlock)
from server.errors import ApiError, bad_request
from server.chat import message_dict
from server.protocol import ChatCompletionRequest

_PARAMS = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "tool_choice": "tool_choice",
           "messages": "messages", "tools": "tools", "response_format": "output_config.format"}


def renamed(err: ApiError) -> ApiError:
    param = err.param
    if param is not None:
        for chat_name, ours in _PARAMS.items():
            if param == chat_name or param.startswith((chat_name + ".", chat_name + "[")):
                new = ours + param[len(chat_name):]
                message = new + err.message[len(param):] if err.message.startswith(param) else err.message
                return ApiError(err.status, message, new, err.code, err.headers)
    return err


def chat_messages(body: CountTokensRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if body.system is not None:
        text = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system)
        out.append(ChatMessage(role="system", content=text))
    for i, message in enumerate(body.messages):
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) \
            else message.content
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        if message.role == "user":
            for b in blocks:
                if isinstance(b, ToolUseBlock):
                    raise bad_request(f"messages[{i}].content: tool_use blocks belong in assistant turns",
                                      f"messages[{i}].content")
                if isinstance(b, ToolResultBlock):
                    content = b.text()
                    out.append(ChatMessage(role="tool", content=f"Error: {content}" if b.is_error else content,
                                           tool_call_id=b.tool_use_id))
            if text or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append(ChatMessage(role="user", content=text))
        else:
            calls = []
            for b in blocks:
                if isinstance(b, ToolResultBlock):
                    raise bad_request(f"messages[{i}].content: tool_result blocks belong in user turns",
                                      f"messages[{i}].content")
                if isinstance(b, ToolUseBlock):
                    calls.append(ChatToolCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False)))
            out.append(ChatMessage(role="assistant", content=text, tool_calls=calls or None))
    return out


def template_thinking(body: CountTokensRequest) -> dict | None:
    if isinstance(body.thinking, ThinkingEnabled):
        return {"enable_thinking": True}
    if isinstance(body.thinking, ThinkingDisabled):
        return {"enable_thinking": False}
    return None


def chat_tools(body: CountTokensRequest) -> list[dict] | None:
    if not body.tools:
        return None
    return [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                              **({"description": t.description} if t.description else {})}}
            for t in body.tools]


def chat_request(body: MessagesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    chat: dict = {"model": body.model, "max_completion_tokens": body.max_tokens,
                  "messages": [message_dict(m) for m in messages]}
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(body, name)
        if value is not None:
            chat[name] = value
    if body.stop_sequences:
        chat["stop"] = body.stop_sequences
    tools = chat_tools(body)
    if tools is not None:
        chat["tools"] = tools
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise bad_request("tool_choice.name: required when type is tool", "tool_choice.name")
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use:
            chat["parallel_tool_calls"] = False
    kwargs = template_thinking(body)
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    config = body.output_config
    if config is not None and config.format is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                          "schema": config.format.schema_}}
    if config is not None and config.effort is not None:
        chat["reasoning_effort"] = "xhigh" if config.effort == "max" else config.effort
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise bad_request(f"{loc}: {first.get('msg')}", loc) from None

