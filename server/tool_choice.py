"""tools + tool_choice + parallel_tool_calls: which tools the prompt shows, and the grammar.

As vLLM: `none` shows no tools and parses no calls; `auto` (the default when tools are given)
lets the model choose, and a call it starts is held to the format and its tool's parameter
schema by a grammar that triggers on `<tool_call>`; `required` makes the output one or more calls
(exactly one with parallel_tool_calls false), a named function exactly one call of it. The
grammar is an xgrammar structural tag over the hermes format (`common.tool_format`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.messages import StructuredOutputs
from common.structured_outputs import MAX_WHITESPACE
from common.tool_format import CALL_END, CALL_OPEN, CALL_PREFIX, CALL_SEPARATOR, ARGUMENTS_FIELD
from server.errors import bad_request
from server.protocol import ChatCompletionRequest, NamedToolChoice, ToolIn

NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    tools: list[dict]  # for the prompt, as OpenAI's tool objects
    grammar: StructuredOutputs | None
    mode: str  # "auto", "required" or "named"


def plan_tools(body: ChatCompletionRequest) -> ToolPlan | None:
    """None when the request has no tools to offer (none given, or tool_choice none)."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice: requires tools", "tool_choice")
        return None
    if choice == "none":
        return None
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", "tools")
    tools = body.tools
    parallel = body.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in body.tools if t.function.name == choice.function.name]
        if not tools:
            raise bad_request(f"tool_choice: no tool named {choice.function.name!r} in tools", "tool_choice")
        fmt = {"type": "tags_with_separator", "tags": [_tag(tools[0])], "separator": CALL_SEPARATOR,
               "at_least_one": True, "stop_after_first": True}
        mode = "named"
    elif choice == "required":
        fmt = {"type": "tags_with_separator", "tags": [_tag(t) for t in tools], "separator": CALL_SEPARATOR,
               "at_least_one": True, "stop_after_first": not parallel}
        mode = "required"
    else:
        fmt = {"type": "triggered_tags", "triggers": [CALL_OPEN], "tags": [_tag(t) for t in tools],
               "stop_after_first": not parallel}
        mode = "auto"
    grammar = StructuredOutputs("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}), "tools")
    return ToolPlan([t.model_dump(exclude_none=True, by_alias=True) for t in body.tools], grammar, mode)


def _tag(tool: ToolIn) -> dict:
    """One call of `tool`: the fixed text around its arguments, which follow its parameter schema."""
    return {"type": "tag", "begin": CALL_PREFIX + tool.function.name + ARGUMENTS_FIELD,
            "content": {"type": "json_schema", "json_schema": tool.function.parameters or NO_PARAMETERS,
                        "max_whitespace_cnt": MAX_WHITESPACE},
            "end": CALL_END}
