"""The event loop the load generator runs on: uvloop where it is installed, else asyncio's own.

The load generator shares the machine with the server it measures. On asyncio's selector loop
it slowed our server by a quarter at concurrency 32 on 2 cores (TPOT median 47.3 vs 35.8 ms,
the same server, one run after the other) while using about the same CPU time, so what it
costs the server is most likely how often it wakes and preempts the engine's threads.
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
