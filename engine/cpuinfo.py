"""The host CPU as /proc/cpuinfo describes it (its first processor): one reader for the
platform's feature detection, the native kernels' build key and the roofline's machine name."""
from __future__ import annotations

from pathlib import Path


def cpuinfo_field(name: str) -> str | None:
    """The value of the first `name : value` line of /proc/cpuinfo, or None (not Linux, no such
    field)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return None
