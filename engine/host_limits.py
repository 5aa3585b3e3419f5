"""What this process may really use on the host: cgroup (container) limits included.

/proc/meminfo and os.cpu_count() describe the whole host; inside a container with a memory or
CPU limit, sizing the KV cache or the thread pool from them over-commits (OOM kill, threads
fighting for a 2-CPU quota). cgroup v2 files win when present.
"""
from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def available_host_memory() -> int:
    """Bytes this process can still allocate: MemAvailable, capped by the cgroup's headroom."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    available = info.get("MemAvailable", info["MemFree"])
    limit, used = _read(CGROUP / "memory.max"), _read(CGROUP / "memory.current")
    if limit and limit != "max" and used:
        available = min(available, max(int(limit) - int(used), 0))
    return available


def cpu_quota() -> int | None:
    """CPUs granted by the cgroup's cpu.max ("quota period"), rounded up; None when unlimited."""
    value = _read(CGROUP / "cpu.max")
    if not value:
        return None
    quota, _, period = value.partition(" ")
    if quota == "max" or not period:
        return None
    return max(1, -(-int(quota) // int(period)))


def default_num_threads() -> int:
    """Threads for torch: the CPUs this process may run on, capped by the cgroup quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    return min(cpus, quota) if quota else cpus


def limit_torch_threads() -> None:
    """Size torch's pool to the CPUs granted, unless the user chose with OMP_NUM_THREADS."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(default_num_threads())
