"""The chat template's own variables for one request: the server's defaults, then the request's.

`--default-chat-template-kwargs` gives every request's template variables (Qwen3's
`enable_thinking`, ...); a request's `chat_template_kwargs` (vLLM's field, on chat completions and
/v1/responses) override them key by key, and `reasoning_effort` (chat) or `reasoning.effort`
(responses) becomes the variable `reasoning_effort`, which templates that take an effort read
(gpt-oss's; a template that does not mention it is unaffected). Names that apply_chat_template
uses itself are refused: they would change how the prompt is built, not what the template says.
"""
from __future__ import annotations

from typing import Any

from server.errors import bad_request

RESERVED = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                      "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                      "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def template_kwargs(defaults: dict | None, requested: dict[str, Any] | None, reasoning_effort: str | None,
                    param: str = "chat_template_kwargs") -> dict | None:
    merged = dict(defaults or {})
    if reasoning_effort is not None:
        merged["reasoning_effort"] = reasoning_effort
    for key, value in (requested or {}).items():
        if key in RESERVED:
            raise bad_request(f"{param}.{key}: set by the server, not a template variable", f"{param}.{key}")
        merged[key] = value
    return merged or None


def thinking_enabled(kwargs: dict | None) -> bool:
    """Whether the template is asked to let the model think (Qwen3's switch; on unless false)."""
    return (kwargs or {}).get("enable_thinking", True) is not False
