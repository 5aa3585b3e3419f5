"""Other work on the machine, for contention tests: busy-looping processes, one per CPU.

Each hog stops by itself after its time is up, so an interrupted test leaves nothing running
for long; the context manager also kills them when its block ends.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Pure Python arithmetic: it competes for the cores without touching memory bandwidth or disk.
_LOOP = ("import time\nend = time.monotonic() + {seconds}\nx = 0\n"
         "while time.monotonic() < end:\n    x = (x * 31 + 7) % 1000003\n")


def num_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextmanager
def cpu_hogs(seconds: float, count: int | None = None) -> Iterator[list[subprocess.Popen]]:
    """`count` hogs (default: one per CPU this process may use), at the same priority as the
    server, each ending after `seconds` at the latest."""
    hogs = [subprocess.Popen([sys.executable, "-c", _LOOP.format(seconds=float(seconds))])
            for _ in range(count or num_cpus())]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def still_running(hogs: list[subprocess.Popen]) -> bool:
    """Whether every hog was still competing (a test checks this at its end: otherwise the
    contention it claims ended early)."""
    return all(hog.poll() is None for hog in hogs)
