"""Keep freed heap memory in the process instead of returning it to the OS after every step.

torch's CPU tensors come from glibc's malloc. A step's large temporaries (a [batch, vocab]
float32 tensor is 6 MB at 32 rows of a 49k vocabulary, and the sampler makes several) are freed
at the end of the step; glibc then trims the top of its heap, and the next step faults the same
pages in again: thousands of page faults and several milliseconds of system time per step.
A fixed mmap threshold and a high trim threshold keep that memory mapped; allocations above the
mmap threshold (the KV cache, weights) still get their own mapping.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 1 << 30
MMAP_THRESHOLD_BYTES = 64 << 20


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    if not ok:
        logger.debug("mallopt refused the heap thresholds; freed memory may be returned after each step")
    return ok
