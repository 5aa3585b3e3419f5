"""The incremental hermes tool-call parser: any split of a text into pieces gives the same
content, calls and arguments as the whole text at once (what makes streamed tool-call deltas
equal the non-streamed answer), and text that only looks like a call stays content."""
from __future__ import annotations

import random

import pytest

from server.tool_parser import ToolCallParser

TWO_CALLS = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"r}is", "n": [1, {"x": 2}]}}\n'
             '</tool_call>\n<tool_call>\n{"name": "noargs", "arguments": {}}\n</tool_call> bye')
CASES = [
    (TWO_CALLS, "Sure. \n bye", [("get_weather", '{"city": "Pa\\"r}is", "n": [1, {"x": 2}]}'), ("noargs", "{}")]),
    ("no call here <tool_ca", "no call here <tool_ca", []),  # held back, then given back at the end
    ("a <tool_call> not json", "a <tool_call> not json", []),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1', "", [("f", '{"a": 1')]),  # cut by max_tokens
    ('<tool_call>\n{"name": "f", "arguments": 5}\n</tool_call>x', "x", [("f", "5")]),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}, "extra": 2}\n</tool_call>tail', "tail", [("f", '{"a": 1}')]),
    ('<tool_call>{"name":"caf\\u00e9","arguments":{"s":"<tool_call>"}}</tool_call>', "",
     [("café", '{"s":"<tool_call>"}')]),
]


def parse(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]]]:
    parser = ToolCallParser()
    content, calls = "", {}
    bounds = [0, *sorted(cuts), len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] + [parser.finish()]
    for d in deltas:
        for kind, value in d.events:
            if kind == "content":
                content += value
            elif kind == "call":
                calls[value.index] = [value.name, ""]
            else:
                index, fragment = value
                calls[index][1] += fragment
    assert [(c.name, c.arguments) for c in parser.calls] == [tuple(v) for _, v in sorted(calls.items())]
    return content, [tuple(v) for _, v in sorted(calls.items())]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_every_split_parses_like_the_whole(text, content, calls):
    assert parse(text, []) == (content, calls)
    assert parse(text, list(range(1, len(text)))) == (content, calls)  # one character at a time
    rng = random.Random(len(text))
    for _ in range(100):
        cuts = rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1)))
        assert parse(text, cuts) == (content, calls), cuts
