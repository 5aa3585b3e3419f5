"""A conversation with tools, as the chat template gets it.

A template with a hermes tools branch of its own (it mentions `tools` and `<tool_call>`: Qwen 2.5,
Qwen 3, Hermes) gets the tools through `apply_chat_template(tools=...)` and the calls and tool
turns in Hugging Face's message shape. Any other template (SmolLM2's, or one whose tools branch
asks for another format, which the grammar and the parser would not read) gets the hermes format
written into
plain turns: the tool instructions lead the system message, an assistant turn's calls follow its
text as `<tool_call>` blocks, and tool answers become a user turn of `<tool_response>` blocks
(consecutive answers joined), as Qwen 2.5's template renders them.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

from common.messages import ChatMessage
from common.tool_format import CALL_OPEN, CALL_SEPARATOR, render_call, render_response, system_prompt


def template_has_hermes_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template and CALL_OPEN in chat_template


def with_template_tools(messages: Sequence[ChatMessage]) -> list[dict]:
    """Hugging Face's shape: tool_calls with their arguments as objects, tool turns by role."""
    conversation = []
    for m in messages:
        entry: dict = {"role": m.role, "content": m.content}
        if m.name is not None:
            entry["name"] = m.name
        if m.tool_calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                   for c in m.tool_calls]
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        conversation.append(entry)
    return conversation


def with_hermes_tools(messages: Sequence[ChatMessage], tools: list[dict] | None) -> list[dict]:
    conversation: list[dict] = []
    for m in messages:
        if m.role == "tool":
            answer = render_response(m.content)
            if conversation and conversation[-1].get("_tool_answers"):
                conversation[-1]["content"] += "\n" + answer
            else:
                conversation.append({"role": "user", "content": answer, "_tool_answers": True})
            continue
        content = m.content
        if m.tool_calls:
            calls = CALL_SEPARATOR.join(render_call(c.name, c.arguments) for c in m.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        entry = {"role": m.role, "content": content}
        if m.name is not None:
            entry["name"] = m.name
        conversation.append(entry)
    for entry in conversation:
        entry.pop("_tool_answers", None)
    if tools:
        instructions = system_prompt(tools)
        if conversation and conversation[0]["role"] == "system":
            conversation[0]["content"] = f"{conversation[0]['content']}\n\n{instructions}"
        else:
            conversation.insert(0, {"role": "system", "content": instructions})
    return conversation


def _arguments(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # as the client sent it
