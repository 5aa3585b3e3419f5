"""The tokenizer worker's part of a traced request (`"trace": true`).

It adds the stops that happen here, timed for this request alone: the chat template (messages ->
text), tokenization (text -> [1, num_tokens] ids), and detokenization of the traced choice's
tokens (with the stop-string check, which runs in the same call). The engine's records arrive in
parts on the choice's token deltas (the prefill's, then the first decode's); the whole trace goes
to the server on the request's last text delta, the one with usage. One choice is traced: index 0
(the first prompt's first choice), so n > 1 costs the engine nothing more.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from common.messages import ChatMessage, EngineTrace, RequestTrace, TraceStop

TRACED_CHOICE = 0
T = TypeVar("T")


def timed(fn: Callable[..., T], *args) -> tuple[T, float]:
    """fn(*args) and its wall time in ms."""
    start = time.perf_counter()
    result = fn(*args)
    return result, round((time.perf_counter() - start) * 1e3, 4)


def _text(chars: int) -> str:
    return f"text: {chars} characters"


def chat_stops(messages: Sequence[ChatMessage], text: str, ids: list[int], template_ms: float,
               tokenize_ms: float) -> list[TraceStop]:
    chars = sum(len(m.content) for m in messages)
    given = f"{len(messages)} message{'' if len(messages) == 1 else 's'}, {chars} characters"
    return [TraceStop("chat_template", given, _text(len(text)),
                      template_ms, note="the model's chat template (role markers, generation prompt)"),
            TraceStop("tokenization", _text(len(text)), [1, len(ids)], tokenize_ms)]


def prompt_stops(prompt: str | list[int], ids: list[int], tokenize_ms: float) -> list[TraceStop]:
    given = _text(len(prompt)) if isinstance(prompt, str) else f"{len(prompt)} token ids"
    return [TraceStop("tokenization", given, [1, len(ids)], tokenize_ms)]


class RequestTraceBuilder:
    def __init__(self, prompt_stops: list[TraceStop]):
        self.trace = RequestTrace(choice=TRACED_CHOICE, prompt_stops=prompt_stops)

    def on_engine(self, part: EngineTrace) -> None:
        """A part from the engine: its first, or the step it adds to the first."""
        engine = self.trace.engine
        if engine is None:
            self.trace.engine = part
            return
        engine.prefill = part.prefill or engine.prefill
        engine.decode = part.decode or engine.decode

    def on_detokenized(self, part: EngineTrace | None, num_ids: int, text: str, ms: float) -> None:
        """One delta of the traced choice through the detokenizer; `part` the engine's record of
        the step that made its tokens, if any."""
        trace = self.trace
        trace.detokenize_ms = round(trace.detokenize_ms + ms, 4)
        trace.detokenized_tokens += num_ids
        stop = TraceStop("detokenization", [num_ids], _text(len(text)), ms,
                         note="incremental: ids -> the text safe to stream, stop strings checked")
        if part is not None and part.prefill is not None:
            trace.detokenize_prefill = stop
        if part is not None and part.decode is not None:
            trace.detokenize_decode = stop

    def build(self) -> RequestTrace:
        return self.trace
