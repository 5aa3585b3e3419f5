"""The hermes tool-call format, one definition for the prompt, the grammar and the parser.

A call is written `<tool_call>\\n{"name": "<name>", "arguments": <JSON>}\\n</tool_call>`, calls one
after the other separated by a newline (Hermes 2 Pro, Qwen 2.5 and Qwen 3 use it; vLLM's `hermes`
parser reads it). A tool's answer goes back to the model as `<tool_response>\\n...\\n</tool_response>`.
"""
from __future__ import annotations

import json

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_PREFIX = CALL_OPEN + '\n{"name": "'  # then the name, then ARGUMENTS_FIELD
ARGUMENTS_FIELD = '", "arguments": '
CALL_END = "}\n" + CALL_CLOSE
CALL_SEPARATOR = "\n"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"


def render_call(name: str, arguments: str) -> str:
    """One call as the model writes it; `arguments` is JSON text (an object)."""
    return CALL_PREFIX + name + ARGUMENTS_FIELD + (arguments.strip() or "{}") + CALL_END


def render_response(content: str) -> str:
    return f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"


def system_prompt(tools: list[dict]) -> str:
    """The tool instructions for a chat template that has no tools branch of its own (Qwen 2.5's
    wording): every tool's signature, then how to call one."""
    signatures = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{signatures}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f"{CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_OPEN}\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n' + CALL_CLOSE)
