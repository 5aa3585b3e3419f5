"""A message's content blocks, built from the turn's events; streamed as Anthropic's events.

As for /v1/responses, one builder gives both forms: fed piece by piece it returns the
`content_block_start` / `content_block_delta` / `content_block_stop` events, and its blocks at the
end are the non-streamed message's `content`. Blocks: `thinking` (the reasoning, with an empty
signature: nothing here verifies one), `text`, and one `tool_use` per call (its arguments streamed
as `input_json_delta` fragments, parsed into `input` at the end).
"""
from __future__ import annotations

import json

from server.tool_parser import ToolCall
from server.turn_parser import TurnParser


class BlockBuilder:
    def __init__(self, parser: TurnParser):
        self.parser = parser
        self.blocks: list[dict] = []
        self._open = False
        self._arguments: dict[int, list[str]] = {}  # block index -> its call's argument text

    def feed(self, text: str) -> list[tuple[str, dict]]:
        return self._events(self.parser.feed(text))

    def finish(self) -> list[tuple[str, dict]]:
        return self._events(self.parser.finish()) + self._close()

    @property
    def called(self) -> bool:
        return bool(self.parser.calls)

    def _events(self, parsed) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        for kind, value in parsed:
            if kind == "call":
                assert isinstance(value, ToolCall)
                out += self._start({"type": "tool_use", "id": value.id.replace("call_", "toolu_", 1),
                                    "name": value.name, "input": {}})
                self._arguments[len(self.blocks) - 1] = []
                continue
            if kind == "arguments":
                _, fragment = value  # type: ignore[misc]
                self._arguments[len(self.blocks) - 1].append(fragment)
                delta = {"type": "input_json_delta", "partial_json": fragment}
            elif kind == "reasoning":
                out += self._ensure({"type": "thinking", "thinking": "", "signature": ""})
                self.blocks[-1]["thinking"] += value
                delta = {"type": "thinking_delta", "thinking": value}
            else:
                out += self._ensure({"type": "text", "text": ""})
                self.blocks[-1]["text"] += value
                delta = {"type": "text_delta", "text": value}
            out.append(("content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1,
                                                "delta": delta}))
        return out

    def _ensure(self, block: dict) -> list[tuple[str, dict]]:
        if self._open and self.blocks[-1]["type"] == block["type"]:
            return []
        return self._start(block)

    def _start(self, block: dict) -> list[tuple[str, dict]]:
        out = self._close()
        self.blocks.append(block)
        self._open = True
        return out + [("content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                               "content_block": dict(block)})]

    def _close(self) -> list[tuple[str, dict]]:
        if not self._open:
            return []
        self._open = False
        index = len(self.blocks) - 1
        block = self.blocks[index]
        if block["type"] == "tool_use":
            block["input"] = _input(self._arguments[index])
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]


def _input(fragments: list[str]) -> dict:
    """The call's arguments as an object; arguments cut short (max_tokens) or not an object: {}."""
    text = "".join(fragments).strip()
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(finish_reason: str | None, stop: object, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) as Anthropic names them."""
    if finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None
