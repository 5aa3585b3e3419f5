"""Splitting a model's `<think>...</think>` out of its text, incrementally (--reasoning-parser).

`qwen3`: the reasoning is a `<think>` block at the start of the output (Qwen3 writes it unless the
chat template was told `enable_thinking: false`, which puts an empty block into the prompt); an
output that does not start with `<think>` is all answer. `deepseek_r1`: the chat template opens
the block in the prompt, so the output is reasoning from its first character (a `<think>` there
is dropped) up to `</think>`. In both, an output cut before `</think>` is all reasoning, as vLLM
parses them. Whitespace around the reasoning and before the answer is dropped (Qwen3 writes
"<think>\\n...\\n</think>\\n\\n"). Feeding the text in any pieces gives the same split as feeding it
whole, so a stream reassembles to the non-streamed answer by construction.
"""
from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")


class ReasoningParser:
    def __init__(self, kind: str):
        if kind not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {kind!r}")
        self.kind = kind
        # start: deciding whether a block opens; reasoning; answer_start: whitespace after the
        # block is held back; answer
        self._state = "start"
        self._buf = ""
        self._started_reasoning = False  # any reasoning text sent (leading whitespace is dropped)

    def feed(self, text: str) -> list[tuple[str, str]]:
        """("reasoning" | "content", text) pieces, in order, of what is certain so far."""
        out: list[tuple[str, str]] = []
        self._buf += text
        while self._step(out):
            pass
        return [(k, v) for k, v in out if v]

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self._state == "start":
            stripped = self._buf.lstrip()
            if self.kind == "qwen3":
                out.append(("content", self._buf))  # never became "<think>": answer text
            elif not THINK_OPEN.startswith(stripped) or not stripped:
                out.append(("reasoning", stripped))
        elif self._state == "reasoning":
            out.append(("reasoning", self._buf.rstrip() if self._started_reasoning else self._buf.strip()))
        elif self._state == "answer":
            out.append(("content", self._buf))
        self._buf = ""
        return [(k, v) for k, v in out if v]

    def _step(self, out: list[tuple[str, str]]) -> bool:
        if self._state == "start":
            stripped = self._buf.lstrip()
            if stripped.startswith(THINK_OPEN):
                self._buf, self._state = stripped[len(THINK_OPEN):], "reasoning"
                return True
            if THINK_OPEN.startswith(stripped):
                return False  # still "", or a prefix of "<think>"
            self._state = "answer" if self.kind == "qwen3" else "reasoning"
            return True
        if self._state == "reasoning":
            if not self._started_reasoning:
                self._buf = self._buf.lstrip()
            at = self._buf.find(THINK_CLOSE)
            if at >= 0:
                self._emit_reasoning(out, self._buf[:at].rstrip())
                self._buf, self._state = self._buf[at + len(THINK_CLOSE):], "answer_start"
                return True
            # Held back: a possible start of "</think>", and trailing whitespace (dropped if the
            # block ends right after it).
            keep = _partial_suffix(self._buf, THINK_CLOSE)
            body = self._buf[:len(self._buf) - keep]
            sent = body.rstrip()
            self._emit_reasoning(out, sent)
            self._buf = self._buf[len(sent):]
            return False
        if self._state == "answer_start":
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = "answer"
            return True
        out.append(("content", self._buf))  # answer
        self._buf = ""
        return False

    def _emit_reasoning(self, out: list[tuple[str, str]], text: str) -> None:
        if text:
            self._started_reasoning = True
            out.append(("reasoning", text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_reasoning(kind: str, text: str) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a whole output."""
    parser = ReasoningParser(kind)
    pieces = parser.feed(text) + parser.finish()
    reasoning = "".join(v for k, v in pieces if k == "reasoning")
    return (reasoning or None), "".join(v for k, v in pieces if k == "content")
