"""Stop strings over streamed text, for one request choice.

Text arrives in pieces (whatever the detokenizer could safely decode this step). A stop string
may span pieces and may start in the middle of one, and streamed text can never be taken back,
so while the tail of the text could still grow into a stop string it is held back here. When a
stop string completes, the output ends right before it (or right after it with
`include_stop_str_in_output`) and everything after it is dropped.

Which stop string wins: the first one to be completed when the text is read left to right
(earliest end); of several ending at the same character, the longest (earliest start). This is
what a generation that halts at the first stop string produces, and it does not depend on how
the text was cut into pieces.

Cost per `add` is O((len(text) + longest stop) * number of stops): the search only looks at
the held tail plus the new text, never at what was already emitted. That is enough because a
match cannot start inside emitted text: its beginning would have been a held tail.
"""
from __future__ import annotations

from collections.abc import Sequence


class StopChecker:
    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False):
        assert all(stop), f"empty stop string in {stop!r}: request validation must reject it"
        self._stops = tuple(dict.fromkeys(stop))  # deduplicated, order kept
        self._include_stop_str_in_output = include_stop_str_in_output
        # The longest tail of the text seen so far that is a proper prefix of a stop string;
        # not returned yet. Always shorter than the longest stop string.
        self._held = ""
        self.stop_hit: str | None = None  # the stop string that ended the text, once one has

    def add(self, text: str) -> str:
        """Take the next piece of text; return the part that is safe to stream now."""
        if self.stop_hit is not None:
            return ""  # finished: later pieces (tokens already in flight) are dropped
        if not self._stops:
            return text
        buffer = self._held + text
        match = self._first_completed_match(buffer)
        if match is not None:
            start, stop = match
            self.stop_hit = stop
            self._held = ""
            return buffer[: start + len(stop)] if self._include_stop_str_in_output else buffer[:start]
        num_held_chars = self._longest_tail_that_starts_a_stop(buffer)
        self._held = buffer[len(buffer) - num_held_chars :]
        return buffer[: len(buffer) - num_held_chars]

    def flush(self) -> str:
        """The text ended for another reason: the held tail is plain text after all."""
        held, self._held = self._held, ""
        return held

    def _first_completed_match(self, buffer: str) -> tuple[int, str] | None:
        """(start, stop string) of the match with the earliest end, ties to the earliest start."""
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            # The first occurrence of one string is also its earliest-ending one.
            start = buffer.find(stop)
            if start < 0:
                continue
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _longest_tail_that_starts_a_stop(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            # A full match was ruled out by the caller, so only proper prefixes can remain.
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest
