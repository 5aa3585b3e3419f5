"""One assistant turn's text as events: reasoning, answer text, tool calls and their arguments.

The endpoints that speak in items or blocks (/v1/responses, /v1/messages) read a choice's text
through this: the reasoning parser (server/reasoning.py, when the server has one) splits off the
`<think>` block first, then the tool-call parser (server/tool_parser.py, when tools are offered)
reads the answer. Answer text that is only whitespace is held until other text follows (then both
go) or the turn ends (sent if no call was made, dropped beside calls: the newline between two
calls is no message). Fed in any pieces, the events join to those of the whole text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from server.reasoning import ReasoningParser
from server.tool_parser import ToolCall, ToolCallParser

# ("reasoning", str) | ("content", str) | ("call", ToolCall) | ("arguments", (call index, str))
Event = tuple[str, object]


class TurnParser:
    def __init__(self, reasoning_parser: str | None, parse_tools: bool):
        self.reasoning = ReasoningParser(reasoning_parser) if reasoning_parser else None
        self.tools = ToolCallParser() if parse_tools else None
        self._held_space = ""
        self._sent_text = False

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools is not None else []

    def feed(self, text: str) -> list[Event]:
        pieces = self.reasoning.feed(text) if self.reasoning is not None else [("content", text)]
        return self._answer(pieces, finished=False)

    def finish(self) -> list[Event]:
        pieces = self.reasoning.finish() if self.reasoning is not None else []
        return self._answer(pieces, finished=True)

    def _answer(self, pieces: list[tuple[str, str]], finished: bool) -> list[Event]:
        events: list[Event] = []
        for kind, text in pieces:
            if kind == "reasoning":
                events.append((kind, text))
            elif self.tools is None:
                events.append(("content", text))
            else:
                events += self.tools.feed(text).events
        if finished and self.tools is not None:
            events += self.tools.finish().events
        return self._hold_whitespace(events, finished)

    def _hold_whitespace(self, events: list[Event], finished: bool) -> list[Event]:
        out: list[Event] = []
        for kind, value in events:
            if kind == "content":
                assert isinstance(value, str)
                if not value:
                    continue
                if not self._sent_text:
                    if not value.strip():
                        self._held_space += value
                        continue
                    value, self._held_space = self._held_space + value, ""
                    self._sent_text = True
            out.append((kind, value))
        if finished and self._held_space:
            if not self.calls:
                out.append(("content", self._held_space))
            self._held_space = ""
        return out


@dataclass
class Turn:
    """A whole turn, as the non-streamed answers give it."""

    reasoning: str | None
    content: str
    calls: list[ToolCall] = field(default_factory=list)


def parse_turn(text: str, reasoning_parser: str | None, parse_tools: bool) -> Turn:
    parser = TurnParser(reasoning_parser, parse_tools)
    events = parser.feed(text) + parser.finish()
    reasoning = "".join(str(v) for k, v in events if k == "reasoning")
    content = "".join(str(v) for k, v in events if k == "content")
    return Turn(reasoning or None, content, parser.calls)
