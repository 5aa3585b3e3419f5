"""Other work on the machine, for contention tests: busy-looping processes, one per CPU.

A hog runs until the test ends it: the context manager kills the hogs when its block ends, and a
hog whose parent is gone (a test run killed outright) stops by itself, so nothing is left
running. No hog stops on a clock: on a loaded machine a test may take any time, and the hogs must
compete for all of it. Whether they did is counted, not timed: `competed` reads the CPU time each
hog was given from /proc.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Pure Python arithmetic: it competes for the cores without touching memory bandwidth or disk.
# The parent's pid is looked at every 2**16 iterations (a few milliseconds).
_LOOP = ("import os\nparent = os.getppid()\nx = i = 0\n"
         "while (i := i + 1) & 0xFFFF or os.getppid() == parent:\n    x = (x * 31 + 7) % 1000003\n")


def num_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextmanager
def cpu_hogs(count: int | None = None) -> Iterator[list[subprocess.Popen]]:
    """`count` hogs (default: one per CPU this process may use), at the same priority as the
    server, running until the block ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", _LOOP]) for _ in range(count or num_cpus())]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def cpu_ticks(hog: subprocess.Popen) -> int:
    """Clock ticks of CPU the hog has had (user + system, /proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{hog.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"; comm may hold spaces
    return int(fields[11]) + int(fields[12])


def competed(hogs: list[subprocess.Popen], ticks_before: list[int]) -> bool:
    """Whether every hog is still running and was given CPU since `ticks_before` (a test checks
    this at its end: otherwise the contention it claims did not happen)."""
    return all(hog.poll() is None for hog in hogs) and all(
        cpu_ticks(hog) > before for hog, before in zip(hogs, ticks_before, strict=True))
