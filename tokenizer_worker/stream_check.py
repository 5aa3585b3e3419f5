"""Self-check of one streamed choice: its text deltas, joined, against one decode of its ids.

The incremental detokenizer is where streamed text can go subtly wrong (windows that slide,
partial characters held back, the prompt context, stop strings over pieces), and a client
would only see a character lost or doubled. So when a choice finishes, the text it streamed is
compared with `IncrementalDetokenizer.decode_at_once` over the same ids: the same prompt
context and special-token handling, and the same stop strings applied by a fresh StopChecker
to the whole text in one piece. Reusing StopChecker there, rather than a second
implementation of the stop rules, keeps the reference simple and still checks what streaming
adds: the rules give the same cut whether the text came in pieces or at once. A difference is
logged with both texts and reported on the finishing TextDelta (`llm:detokenize_mismatch_total`).

Cost: the choice's ids and text pieces are kept until it finishes (O(output)), then one decode
of them all (`python -m benchmarks.stream_check_cost` measures it).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenizer_worker.detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)

SHOWN_CHARS = 120  # of each text in the log line, starting a little before the first difference
SHOWN_BEFORE_DIFFERENCE = 40


@dataclass
class StreamCheck:
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)  # what the detokenizer was given
    text_pieces: list[str] = field(default_factory=list)  # what the choice streamed

    def record(self, token_ids: Sequence[int], text: str) -> None:
        """One delta: the ids given to the detokenizer and the text the choice sends for them."""
        self.token_ids.extend(token_ids)
        if text:
            self.text_pieces.append(text)

    def matches(self, request_id: str, index: int) -> bool:
        """Compare at the end of the choice; a difference is logged (one warning) and False."""
        streamed = "".join(self.text_pieces)
        reference = self.detokenizer.decode_at_once(self.token_ids)
        if streamed == reference:
            return True
        at = first_difference(streamed, reference)
        logger.warning("detokenize mismatch in request %s choice %d at character %d: streamed %s, "
                       "full decode %s", request_id, index, at, excerpt(streamed, at), excerpt(reference, at))
        return False


def first_difference(a: str, b: str) -> int:
    """Index of the first character where `a` and `b` differ (the shorter length if one is a
    prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def excerpt(text: str, at: int) -> str:
    """repr of `text` around index `at`, with how much was cut on each side."""
    start = max(0, at - SHOWN_BEFORE_DIFFERENCE)
    end = min(len(text), start + SHOWN_CHARS)
    shown = repr(text[start:end])
    if start > 0:
        shown = f"[{start} chars]…{shown}"
    if end < len(text):
        shown = f"{shown}…[{len(text) - end} chars]"
    return f"{shown} ({len(text)} chars)"
