"""Each structured-outputs grammar compiles here first, before its request goes to the engine.

A grammar that does not compile, or takes longer than the time limit, is a 400 naming its field,
and nothing reaches the engine. Compiles run in background threads (xgrammar releases the GIL),
so the worker keeps detokenizing other requests meanwhile; `poll` hands back the finished ones.
The limit counts from the moment a compile starts, not from its arrival, so a slow grammar
only fails itself. A compile past its deadline is answered at the deadline but cannot be
interrupted: its thread finishes it in the background, and its source is remembered, so the
same grammar sent again is refused at once (it would otherwise pass from the cache here and
then compile in the engine without a limit). A request that waits for a free compile thread for
longer than the limit gets a 503 (the compilers are busy), not a 400.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from common.errors import InvalidRequest
from common.messages import StructuredOutputs
from common.structured_outputs import compile_structured, new_compiler

DEFAULT_COMPILE_TIMEOUT_S = 10.0
COMPILE_THREADS = 2
MAX_REMEMBERED_SLOW = 1024  # grammar sources that ran out of time, refused at once when sent again


class CompilersBusy(Exception):
    """No compile thread was free within the time limit (a 503, not the client's fault)."""


@dataclass
class PendingCompile:
    request_id: str
    spec: StructuredOutputs
    compiling: Future
    queued_at: float  # time.monotonic()
    then: Callable[[], None]  # what to do once it compiled
    started: list[float] = field(default_factory=list)  # [time.monotonic()] once its thread runs it


class GrammarChecker:
    def __init__(self, tokenizer, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self._compiler = None  # built by the first compile (needs the engine's vocab and stop ids)
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-check")
        self._too_slow: dict[tuple[str, str], None] = {}  # insertion-ordered set, oldest first
        self.pending: dict[str, PendingCompile] = {}

    def submit(self, request_id: str, spec: StructuredOutputs, vocab_size: int, stop_token_ids: list[int],
               then: Callable[[], None]) -> None:
        """Compile `spec`; `then` runs (from `poll`'s caller) once it did."""
        started: list[float] = []

        def compile_one() -> None:
            started.append(time.monotonic())
            with self._compiler_lock:
                if self._compiler is None:
                    self._compiler = new_compiler(self.tokenizer, vocab_size, stop_token_ids)
            compile_structured(self._compiler, spec)

        if (spec.kind, spec.spec) in self._too_slow:
            future: Future = Future()
            future.set_exception(self._timeout_error(spec, again=True))
        else:
            future = self._pool.submit(compile_one)
        self.pending[request_id] = PendingCompile(request_id, spec, future, time.monotonic(), then, started)

    def cancel(self, request_id: str) -> bool:
        p = self.pending.pop(request_id, None)
        if p is not None:
            p.compiling.cancel()  # not started yet: it never runs
        return p is not None

    def poll(self) -> list[tuple[PendingCompile, Exception | None]]:
        """The compiles that ended (None), failed (InvalidRequest), ran out of time (InvalidRequest)
        or never got a thread in time (CompilersBusy)."""
        now = time.monotonic()
        done: list[tuple[PendingCompile, Exception | None]] = []
        for p in list(self.pending.values()):
            if p.compiling.done():
                done.append((p, p.compiling.exception()))
            elif p.started and now - p.started[0] >= self.timeout_s:
                self._remember_slow(p.spec)
                done.append((p, self._timeout_error(p.spec)))
            elif not p.started and now - p.queued_at >= self.timeout_s:
                p.compiling.cancel()
                done.append((p, CompilersBusy("the grammar compilers are busy; retry later")))
            else:
                continue
            del self.pending[p.request_id]
        return done

    def _remember_slow(self, spec: StructuredOutputs) -> None:
        self._too_slow[(spec.kind, spec.spec)] = None
        while len(self._too_slow) > MAX_REMEMBERED_SLOW:
            del self._too_slow[next(iter(self._too_slow))]

    def _timeout_error(self, spec: StructuredOutputs, again: bool = False) -> InvalidRequest:
        return InvalidRequest(spec.param, f"the grammar did not compile within {self.timeout_s:g} s"
                              + (" (refused before)" if again else ""))
