"""Incremental detokenizer: new token ids in, text that is safe to stream out. One per choice.

Decoding every output id again at each step would cost O(n) per token, O(n^2) per request.
Decoding only the new ids is wrong: a byte-level BPE token can carry part of a UTF-8 character
(it decodes to U+FFFD until the rest arrives), and decoders such as SentencePiece's Metaspace
drop the leading space of the first token they see. So, like vLLM and TGI (and `tokenizers`'
DecodeStream), we decode a short window of ids that starts a few tokens before the first unread
one and emit only what it adds to the text of its already-read part:

    window ids:  [ read context ............ | unread ............... ]
                 0                      read_offset          len(window)
    emitted now: decode(window)[len(decode(read context)):]

If that text ends with U+FFFD the last character may be incomplete: hold everything back (the
offsets stay) until more tokens arrive. Otherwise emit it and slide the window: the ids just
read become the context of the next one. An id is decoded while unread, once as the new
context, and in the next window, so a step costs O(new tokens), not O(output length). (Only
output that keeps ending in invalid UTF-8 keeps the window growing, until a valid character
or `flush`; vLLM and TGI share this.)

Stop strings are applied to the emitted text by `StopChecker`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenizer_worker.stop_checker import StopChecker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Prompt ids that seed the first window, so the first output token decodes in context (leading
# space handling); the same number vLLM uses.
NUM_PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"  # what an incomplete (or invalid) UTF-8 sequence decodes to


@dataclass(frozen=True, slots=True)
class DetokenizerOutput:
    text: str  # new text to stream now; may be ""
    stop_hit: str | None = None  # the stop string that ended the output in this call, if any


class IncrementalDetokenizer:
    """Turns one choice's output token ids into text deltas, applying stop strings.

    Finished once a stop string matched or `flush()` was called; later tokens (already in
    flight from the engine) are then ignored.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ):
        # The Rust tokenizer directly: the same decode as `tokenizer.decode` (no clean-up of
        # tokenization spaces, the transformers default) without its per-call Python work.
        self._backend = tokenizer.backend_tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Skipped special tokens add no text; keeping them out of the window keeps it short
        # (a run of them would otherwise never let the offsets move).
        self._skipped_ids = frozenset(
            token_id
            for token_id, added in self._backend.get_added_tokens_decoder().items()
            if added.special and skip_special_tokens
        )
        self._stop = tuple(stop)
        self._include_stop_str_in_output = include_stop_str_in_output
        self._stop_checker = StopChecker(stop, include_stop_str_in_output)
        self._finished = False

        context = self._last_kept_ids(prompt_token_ids, NUM_PROMPT_CONTEXT_TOKENS)
        context_text = self._decode(context)
        if context_text.endswith(REPLACEMENT_CHAR):
            # The prompt ends inside a character: output bytes that continue it would merge
            # with the prompt's. Start without context, so the output decodes as on its own.
            context, context_text = [], ""
        self._context_ids = tuple(context)  # for `decode_at_once`; the window list below changes
        self._context_text = context_text
        self._window_ids: list[int] = context
        self._read_offset = len(context)  # window_ids[:read_offset] is already emitted text
        self._read_text = context_text  # decode(window_ids[:read_offset])

    @property
    def stop_hit(self) -> str | None:
        """The stop string that ended the output (also when it was found by `flush`)."""
        return self._stop_checker.stop_hit

    def add_tokens(self, new_token_ids: Sequence[int]) -> DetokenizerOutput:
        """Take this step's new ids; return the text that is safe to stream now."""
        if self._finished:
            return DetokenizerOutput("")
        self._window_ids.extend(t for t in new_token_ids if t not in self._skipped_ids)
        text = self._stop_checker.add(self._read_new_text())
        self._finished = self.stop_hit is not None
        return DetokenizerOutput(text, self.stop_hit)

    def flush(self) -> str:
        """The request ended for another reason (EOS, length, abort): release held-back text.

        An incomplete UTF-8 sequence at the very end is released as decoded (U+FFFD), so the
        concatenated output equals the full decode. The stop strings still apply to that tail;
        check `stop_hit` afterwards.
        """
        if self._finished:
            return ""
        self._finished = True
        tail = ""
        if len(self._window_ids) > self._read_offset:
            tail = self._decode(self._window_ids)[len(self._read_text) :]
        return self._stop_checker.add(tail) + self._stop_checker.flush()

    def decode_at_once(self, token_ids: Sequence[int]) -> str:
        """What `add_tokens` and `flush` should stream in all for these output ids: one decode
        of them all after the same prompt context, cut by a fresh StopChecker that sees the whole
        text as one piece. The reference of `tokenizer_worker.stream_check`."""
        text = self._backend.decode([*self._context_ids, *token_ids], skip_special_tokens=self._skip_special_tokens)
        stop_checker = StopChecker(self._stop, self._include_stop_str_in_output)
        return stop_checker.add(text[len(self._context_text) :]) + stop_checker.flush()

    def _read_new_text(self) -> str:
        """Emit what the unread ids add to the text, or "" while that is not final yet."""
        if len(self._window_ids) == self._read_offset:
            return ""
        text = self._decode(self._window_ids)
        # Nothing new yet, or the last character may still be incomplete: wait for more ids.
        if len(text) <= len(self._read_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        # Sliced by length, as vLLM does: the read context decodes the same inside the window.
        new_text = text[len(self._read_text) :]
        self._window_ids = self._window_ids[self._read_offset :]
        self._read_offset = len(self._window_ids)
        self._read_text = self._decode(self._window_ids)
        return new_text

    def _last_kept_ids(self, token_ids: Sequence[int], count: int) -> list[int]:
        """The last `count` ids of `token_ids` that are not skipped, in order."""
        kept: list[int] = []
        for token_id in reversed(token_ids):
            if len(kept) == count:
                break
            if token_id not in self._skipped_ids:
                kept.append(token_id)
        kept.reverse()
        return kept

    def _decode(self, token_ids: list[int]) -> str:
        return self._backend.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
