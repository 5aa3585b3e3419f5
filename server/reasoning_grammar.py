"""A grammar that applies to the answer after the reasoning, not to the reasoning itself.

With a reasoning parser on, a request's grammar (response_format, structured_outputs, tools) is
rewritten as an xgrammar structural tag: first the think block with free text inside (`qwen3`:
`<think>...</think>`, which the model may also leave out; `deepseek_r1`: text up to `</think>`,
the prompt having opened the block), then the blank line Qwen3 and DeepSeek-R1 write after it,
then the original grammar. So the model reasons freely and the grammar holds from the answer's
first character, as vLLM's reasoning-aware structured outputs do.
"""
from __future__ import annotations

import json

from common.messages import StructuredOutputs
from common.structured_outputs import MAX_WHITESPACE
from server.reasoning import THINK_CLOSE, THINK_OPEN

ANSWER_SEPARATOR = "\n\n"


def _element(so: StructuredOutputs) -> dict:
    """The grammar as one element of a structural tag."""
    if so.kind in ("json", "json_object"):
        return {"type": "json_schema", "json_schema": json.loads(so.spec), "max_whitespace_cnt": MAX_WHITESPACE}
    if so.kind == "regex":
        return {"type": "regex", "pattern": so.spec}
    if so.kind == "choice":
        return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in json.loads(so.spec)]}
    if so.kind == "grammar":
        return {"type": "grammar", "grammar": so.spec}
    return json.loads(so.spec)["format"]


def after_reasoning(so: StructuredOutputs, parser: str) -> StructuredOutputs:
    answer = _element(so)
    think = {"type": "tag", "begin": THINK_OPEN if parser == "qwen3" else "", "content": {"type": "any_text"},
             "end": THINK_CLOSE}
    fmt: dict = {"type": "sequence",
                 "elements": [think, {"type": "const_string", "value": ANSWER_SEPARATOR}, answer]}
    if parser == "qwen3":
        fmt = {"type": "or", "elements": [fmt, answer]}
    return StructuredOutputs("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}), so.param)
