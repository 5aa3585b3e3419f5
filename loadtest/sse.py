"""Incremental Server-Sent Events parser: text in, one `data` payload per complete event out.

Written by hand (no SSE client library) so the timing of each event is exactly when its last
byte arrived. Follows the WHATWG event-stream rules that matter for OpenAI-style streams:
lines end in "\\n", "\\r\\n" or "\\r"; a blank line ends an event; "data:" lines of one event are
joined with "\\n"; one optional space after the colon is dropped; ":" lines are comments
(sse-starlette's pings); other fields (event:, id:, retry:) are kept only as `event`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"  # the "event:" field; OpenAI-style servers rarely set it


class SSEParser:
    def __init__(self) -> None:
        self._buffer = ""  # text after the last complete line
        self._data_lines: list[str] = []
        self._event = ""
        # A chunk that ends in "\r" may be the first half of "\r\n" split over two reads.
        self._pending_cr = False

    def feed(self, text: str) -> list[SSEEvent]:
        """Add received text; return the events it completed, in order."""
        if self._pending_cr:
            self._pending_cr = False
            if text.startswith("\n"):
                text = text[1:]
        if text.endswith("\r"):
            self._pending_cr = True
        # One line ending in every case; a held-back "\r" was already turned into a line end.
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        self._buffer += text
        *lines, self._buffer = self._buffer.split("\n")
        events: list[SSEEvent] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a last event without its trailing blank line still counts."""
        events = self.feed("\n") if self._buffer else []
        event = self._line("")
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            if not self._data_lines:
                self._event = ""
                return None
            event = SSEEvent("\n".join(self._data_lines), self._event or "message")
            self._data_lines, self._event = [], ""
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data_lines.append(value)
        elif name == "event":
            self._event = value
        return None
