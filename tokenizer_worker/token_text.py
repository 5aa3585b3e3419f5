"""The text and exact bytes of single tokens, for logprobs.

A byte-level BPE token may hold part of a UTF-8 character, so its text alone can be U+FFFD; the
OpenAI `bytes` field carries the real bytes, which clients join to rebuild characters. For
byte-level vocabularies (GPT-2 style) the bytes come from the token's symbols through the
byte-to-symbol table; added tokens and other vocabularies use the UTF-8 of the decoded text.
"""
from __future__ import annotations

from tokenizers import decoders

from common.messages import TextLogprob, TokenLogprob

# JSON has no -inf; like vLLM, report impossible tokens with a very low finite logprob.
MIN_LOGPROB = -9999.0


def _byte_level_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable symbol -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    symbols = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            symbols.append(256 + extra)
            extra += 1
    return {chr(s): b for b, s in zip(printable, symbols, strict=True)}


class TokenText:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        backend = tokenizer.backend_tokenizer
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        self._byte_decoder = _byte_level_decoder() if self._byte_level else {}
        self._added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._compute(token_id)
        return cached

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        if token_id in self._added:
            content = self._added[token_id]
            return content, list(content.encode())
        text = self._tokenizer.decode([token_id])
        if self._byte_level:
            symbols = self._tokenizer.convert_ids_to_tokens(token_id) or ""
            if all(c in self._byte_decoder for c in symbols):
                return text, [self._byte_decoder[c] for c in symbols]
        return text, list(text.encode())

    def logprobs(self, entries: list[list[TokenLogprob]]) -> list[TextLogprob]:
        """Engine logprobs (per token: the sampled one, then the top k) -> text form."""
        out = []
        for sampled, *top in entries:
            token, token_bytes = self.get(sampled.token_id)
            out.append(TextLogprob(token, token_bytes, max(sampled.logprob, MIN_LOGPROB), [
                TextLogprob(*self.get(t.token_id), max(t.logprob, MIN_LOGPROB)) for t in top]))
        return out
