"""The engine's side of structured outputs: compile off the loop, then one matcher per request.

A request with `structured_outputs` gets a RequestGrammar when it arrives: its grammar compiles
in a background thread (xgrammar releases the GIL while compiling), and the scheduler admits the
request only once the compile is done, so the engine loop never waits on one. Then, per step,
`fill_bitmask` writes the allowed next tokens of every constrained request that samples (one
xgrammar call each, a few microseconds) and `accept` advances the matcher with each sampled token.
The matcher lives on the scheduler's Request, so it survives a preemption (the tokens it accepted
stay the request's output) and goes with the request when it finishes or is aborted.

No torch or xgrammar at import: the scheduling layer imports this without either.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from common.messages import StructuredOutputs
from common.structured_outputs import compile_structured, new_compiler

logger = logging.getLogger(__name__)


class RequestGrammar:
    """One request's grammar: a compile in flight, then its matcher (or why it failed)."""

    def __init__(self, compiling: Future):
        self.compiling: Future | None = compiling
        self.matcher: Any = None  # xgrammar.GrammarMatcher once compiled
        self.error: str | None = None

    def ready(self) -> bool:
        """Whether the compile is over (matcher or error set); never blocks."""
        if self.compiling is None:
            return True
        if not self.compiling.done():
            return False
        import xgrammar as xgr

        try:
            self.matcher = xgr.GrammarMatcher(self.compiling.result())
        except Exception as exc:  # noqa: BLE001 - a bad grammar fails its request, not the engine
            self.error = f"structured_outputs: {exc}"
        self.compiling = None
        return True

    @property
    def terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()


@dataclass
class GrammarBitmask:
    """The allowed next tokens of this step's constrained requests: bitmask row i is request_ids[i]'s
    ([n, ceil(vocab / 32)] int32, bit set = allowed; xgrammar's layout)."""

    request_ids: list[str]
    bitmask: Any  # torch.Tensor on the host


class StructuredOutputManager:
    def __init__(self, model_dir: str, vocab_size: int, stop_token_ids: list[int]):
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._compiler: Any = None  # built by the first compile, in the pool's thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._bitmask: Any = None  # [rows, words] int32, grown on demand

    def start(self, so: StructuredOutputs) -> RequestGrammar:
        return RequestGrammar(self._pool.submit(self._compile, so))

    def _compile(self, so: StructuredOutputs):
        if self._compiler is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            self._compiler = new_compiler(tokenizer, self.vocab_size, self.stop_token_ids)
        return compile_structured(self._compiler, so)

    def fill_bitmask(self, requests: list) -> GrammarBitmask:
        """requests: scheduler Requests with a ready matcher that sample this step."""
        import xgrammar as xgr

        n = len(requests)
        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = xgr.allocate_token_bitmask(max(n, 8), self.vocab_size)
        for i, req in enumerate(requests):
            req.grammar.matcher.fill_next_token_bitmask(self._bitmask, i)
        return GrammarBitmask([r.request_id for r in requests], self._bitmask[:n])

    @staticmethod
    def accept(grammar: RequestGrammar, token: int) -> bool:
        """Advance the matcher; False if the grammar refuses the token (the mask allowed it only
        if something outside the grammar changed the logits afterwards)."""
        return bool(grammar.matcher.accept_token(token))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
