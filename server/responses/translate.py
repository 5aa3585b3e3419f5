"""A /v1/responses request as the chat request the rest of the server runs.

Input items become chat messages: messages by role (text parts joined), consecutive
`function_call` items join the assistant turn before them as its tool calls, and each
`function_call_output` becomes a tool message answering its call; reasoning items are dropped.
`instructions` lead as a system message. The other fields map one to one onto chat completions'
(max_output_tokens -> max_completion_tokens, text.format -> response_format, flat function tools
-> nested ones), and the chat checks then run as they do for /v1/chat/completions; a refusal
there names the field as this API calls it.
"""
from __future__ import annotations

from pydantic import ValidationError

from common.messages import ChatMessage, ChatToolCall
from server.errors import ApiError, bad_request
from server.chat import message_dict
from server.protocol import ChatCompletionRequest
from server.responses.protocol import (FunctionCallItem, FunctionCallOutputItem, FunctionToolChoice, MessageItem,
                                       ResponsesRequest, TextFormatJsonObject, TextFormatJsonSchema)

# chat field (as in a refusal's param) -> this API's
_PARAMS = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
           "response_format": "text.format", "messages": "input", "structured_outputs": "text.format"}


def response_param(param: str | None) -> str | None:
    if param is None:
        return None
    for chat_name, ours in _PARAMS.items():
        if param == chat_name or param.startswith(chat_name + ".") or param.startswith(chat_name + "["):
            return ours + param[len(chat_name):] if chat_name != "response_format" else ours
    return param


def renamed(err: ApiError) -> ApiError:
    """The same refusal, naming the field as /v1/responses calls it."""
    param = response_param(err.param)
    message = err.message
    if err.param and param != err.param and message.startswith(err.param):
        message = param + message[len(err.param):]
    return ApiError(err.status, message, param, err.code, err.headers)


def input_messages(body: ResponsesRequest) -> list[ChatMessage]:
    if isinstance(body.input, str):
        return [ChatMessage(role="user", content=body.input)]
    out: list[ChatMessage] = []
    for item in body.input:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append(ChatMessage(role=role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            call = ChatToolCall(item.call_id, item.name, item.arguments)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
        # reasoning items: not shown again
    return out


def chat_request(body: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request for `messages` (the whole conversation, instructions first)."""
    if not messages:
        raise bad_request("input: no message to answer", "input")
    chat: dict = {"model": body.model, "messages": [message_dict(m) for m in messages]}
    for ours, theirs in (("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p"), ("top_k", "top_k"), ("seed", "seed"),
                         ("parallel_tool_calls", "parallel_tool_calls"),
                         ("chat_template_kwargs", "chat_template_kwargs")):
        value = getattr(body, ours)
        if value is not None:
            chat[theirs] = value
    if body.tools:
        chat["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in body.tools]
    if isinstance(body.tool_choice, FunctionToolChoice):
        chat["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    elif body.tool_choice is not None:
        chat["tool_choice"] = body.tool_choice
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, TextFormatJsonSchema):
        chat["response_format"] = {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True,
                                                                                        exclude={"type"})}
    elif isinstance(fmt, TextFormatJsonObject):
        chat["response_format"] = {"type": "json_object"}
    if body.reasoning is not None and body.reasoning.effort is not None:
        chat["reasoning_effort"] = body.reasoning.effort
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:  # what this module built from a valid body: our own fault if it fails
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise bad_request(f"{response_param(loc)}: {first.get('msg')}", response_param(loc)) from None
