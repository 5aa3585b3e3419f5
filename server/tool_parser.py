"""Reading hermes tool calls out of generated text, incrementally (`common.tool_format`).

`feed(text)` takes the next piece of a choice's text and returns what can be said for sure:
content, the start of a call (its name), and fragments of a call's arguments, exactly as the
model wrote them. The whole text fed at once gives the same events joined, so a streamed answer
reassembles to the non-streamed one by construction. Text that might still become `<tool_call>`
is held back until it is clear; a call whose header is not the format's (no "name" then
"arguments") is given back as content. Arguments end where their JSON value closes (strings and
nesting tracked), so a call cut by max_tokens still keeps what it had.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from common.tool_format import CALL_CLOSE, CALL_OPEN

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_TAIL = re.compile(r"\s*\}\s*" + re.escape(CALL_CLOSE))
MAX_HEADER_CHARS = 512  # a header longer than this is no call


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments_parts: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.arguments_parts)


@dataclass
class ParsedDelta:
    """What a piece of text said, in order: ("content", text), ("call", ToolCall) when a call's
    name is known, ("arguments", (call index, fragment))."""

    events: list[tuple[str, object]] = field(default_factory=list)

    def add(self, kind: str, value) -> None:
        if not value:
            return
        last = self.events[-1] if self.events else None
        if kind == "content" and last is not None and last[0] == "content":
            self.events[-1] = ("content", last[1] + value)
        elif kind == "arguments" and last is not None and last[0] == "arguments" and last[1][0] == value[0]:
            self.events[-1] = ("arguments", (value[0], last[1][1] + value[1]))
        else:
            self.events.append((kind, value))

    @property
    def content(self) -> str:
        return "".join(v for k, v in self.events if k == "content")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self._state = "text"  # text | header | arguments | tail
        self._buf = ""
        self._depth = 0  # arguments: open braces and brackets
        self._in_string = False
        self._escaped = False
        self._value_started = False

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while self._step(out):
            pass
        return out

    def finish(self) -> ParsedDelta:
        """The end of the text: what was held back is content (or the open call's, as it is)."""
        out = ParsedDelta()
        if self._state == "text":
            out.add("content", self._buf)
        elif self._state == "header":
            out.add("content", CALL_OPEN + self._buf)
        self._buf, self._state = "", "text"
        return out

    def _step(self, out: ParsedDelta) -> bool:
        """Consume what can be decided from the buffer; True while progress is made."""
        if self._state == "text":
            at = self._buf.find(CALL_OPEN)
            if at < 0:  # keep a tail that may be the start of CALL_OPEN
                keep = _partial_suffix(self._buf, CALL_OPEN)
                out.add("content", self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                return False
            out.add("content", self._buf[:at])
            self._buf, self._state = self._buf[at + len(CALL_OPEN):], "header"
            return True
        if self._state == "header":
            m = _HEADER.match(self._buf)
            if m is None or m.end() == len(self._buf):  # not yet decidable (more whitespace may follow)
                stripped = self._buf.lstrip()
                if (len(self._buf) > MAX_HEADER_CHARS or CALL_CLOSE in self._buf
                        or (stripped and not stripped.startswith("{"))):
                    out.add("content", CALL_OPEN)  # not a call after all: the text goes on as content
                    self._state = "text"
                    return True
                return False
            try:
                name = json.loads(f'"{m.group(1)}"')
            except json.JSONDecodeError:
                name = m.group(1)
            call = ToolCall(len(self.calls), new_call_id(), name)
            self.calls.append(call)
            out.add("call", call)
            self._buf, self._state = self._buf[m.end():], "arguments"
            self._depth, self._in_string, self._escaped, self._value_started = 0, False, False, False
            return True
        if self._state == "arguments":
            end = self._scan_value()
            fragment = self._buf[:end]
            if fragment:
                self.calls[-1].arguments_parts.append(fragment)
                out.add("arguments", (self.calls[-1].index, fragment))
            self._buf = self._buf[end:]
            if self._value_done:
                self._state = "tail"
                return True
            return False
        # tail: the call object's closing brace and CALL_CLOSE; anything else up to CALL_CLOSE is dropped
        m = _TAIL.match(self._buf)
        if m is not None:
            self._buf, self._state = self._buf[m.end():], "text"
            return True
        at = self._buf.find(CALL_CLOSE)
        if at >= 0:
            self._buf, self._state = self._buf[at + len(CALL_CLOSE):], "text"
            return True
        return False

    def _scan_value(self) -> int:
        """How much of the buffer belongs to the arguments' JSON value; sets _value_done."""
        self._value_done = False
        for i, ch in enumerate(self._buf):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                    if self._depth == 0:  # a bare string value
                        self._value_done = True
                        return i + 1
                continue
            if ch in "{[":
                self._depth += 1
                self._value_started = True
            elif ch in "}]":
                if self._depth == 0:  # the call object's brace: a bare value ended before it
                    self._value_done = True
                    return i
                self._depth -= 1
                if self._depth == 0:
                    self._value_done = True
                    return i + 1
            elif ch == '"':
                self._in_string = True
                self._value_started = True
            elif ch == "," and self._depth == 0:
                self._value_done = True
                return i
            elif not ch.isspace():
                self._value_started = True
        return len(self._buf)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0

