"""Each structured-outputs grammar compiles here first, before its request goes to the engine.

A grammar that does not compile, or takes longer than the time limit, is a 400 naming its field,
and nothing reaches the engine. Compiles run in a background thread (xgrammar releases the GIL),
so the worker keeps detokenizing other requests meanwhile; `poll` hands back the finished ones.
A compile past its deadline is answered at the deadline; the thread finishes it in the background
(it cannot be interrupted), and xgrammar's cache keeps the result.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from common.errors import InvalidRequest
from common.messages import StructuredOutputs
from common.structured_outputs import compile_structured, new_compiler

DEFAULT_COMPILE_TIMEOUT_S = 10.0


@dataclass
class PendingCompile:
    request_id: str
    param: str
    compiling: Future
    deadline: float  # time.monotonic()
    then: Callable[[], None]  # what to do once it compiled


class GrammarChecker:
    def __init__(self, tokenizer, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self._compiler = None  # built on the first compile (needs the engine's vocab and stop ids)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-check")
        self.pending: dict[str, PendingCompile] = {}

    def submit(self, request_id: str, specs: list[StructuredOutputs], vocab_size: int, stop_token_ids: list[int],
               then: Callable[[], None]) -> None:
        """Compile `specs` (one per distinct grammar of the request); call `then` when all did."""
        def compile_all() -> None:
            if self._compiler is None:
                self._compiler = new_compiler(self.tokenizer, vocab_size, stop_token_ids)
            for so in specs:
                compile_structured(self._compiler, so)

        self.pending[request_id] = PendingCompile(request_id, specs[0].param, self._pool.submit(compile_all),
                                                  time.monotonic() + self.timeout_s, then)

    def cancel(self, request_id: str) -> bool:
        return self.pending.pop(request_id, None) is not None

    def poll(self) -> list[tuple[PendingCompile, Exception | None]]:
        """The compiles that ended (None) or failed (InvalidRequest) or ran out of time."""
        now = time.monotonic()
        done = []
        for p in list(self.pending.values()):
            if p.compiling.done():
                done.append((p, p.compiling.exception()))
            elif now >= p.deadline:
                done.append((p, InvalidRequest(p.param, f"the grammar did not compile within {self.timeout_s:g} s")))
            else:
                continue
            del self.pending[p.request_id]
        return done
