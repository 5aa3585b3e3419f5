"""The engine's host memory: freed heap memory kept in the process between steps, and the KV
cache on transparent huge pages.

Keep freed heap memory in the process instead of returning it to the OS after every step.

torch's CPU tensors come from glibc's malloc. A step's large temporaries (a [batch, vocab]
float32 tensor is 6 MB at 32 rows of a 49k vocabulary, and the sampler makes several) are freed
at the end of the step; glibc then trims the top of its heap, and the next step faults the same
pages in again: thousands of page faults and several milliseconds of system time per step.
A fixed mmap threshold and a high trim threshold keep that memory mapped; allocations above the
mmap threshold (the KV cache, weights) still get their own mapping.

The KV cache and the kernels' weights on 2 MiB pages: a decode step reads each sequence's blocks (2 KiB per KV head of a
16-token block of 64 bf16 dimensions) wherever the block manager put them, so on 4 KiB pages
nearly every block is a new page and a page walk, and the hardware prefetcher stops at each page
edge. Where the kernel leaves huge pages to madvise (`/sys/kernel/mm/transparent_hugepage/enabled`
is "madvise", the common default), a buffer gets them only when asked before its pages are first
touched, so the cache gets an anonymous mapping of its own (a buffer from the heap may reuse pages
that were touched before). Measured on 30 layers' caches with the blocks spread over the cache,
32 sequences of 190 keys: 16.2 -> 12.2 ms of decode attention per step, of 1,100 keys 81.0 -> 66.6
ms. The weights a decode step streams (the GGUF codes: 96 MB for the default model, each layer's
matrices a few hundred KiB) fare the same on 4 KiB pages: a page walk and a new prefetch stream
every 4 KiB, for a read that is only a few microseconds per matrix. `pack_on_huge_pages` copies them
into one huge-page mapping at start-up (benchmarks.commits, batch 1: 1.17x tok/s).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import mmap
import sys

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 1 << 30
MMAP_THRESHOLD_BYTES = 64 << 20
HUGE_PAGE_BYTES = 2 << 20


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


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, in an anonymous mapping of its own (never heap pages
    that something else touched first, which keep their 4 KiB pages) advised to be huge pages
    before it is touched, from its first 2 MiB boundary on; plain pages where the OS does not take
    the advice (another OS, huge pages turned off). Zeroed here, so the step that first writes a
    block does not pay the page fault."""
    nbytes = math.prod(shape) * dtype.itemsize
    if sys.platform != "linux" or nbytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    # private: a shared anonymous mapping is shmem, whose huge pages are a separate setting
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # (the tensor below keeps the mapping alive: torch.frombuffer holds it)
    region.madvise(mmap.MADV_HUGEPAGE)  # advice only: a refusal leaves 4 KiB pages
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    return raw[start:start + nbytes].view(dtype).view(shape).zero_()


def pack_on_huge_pages(tensors: list[torch.Tensor], align: int = 64) -> list[torch.Tensor]:
    """Contiguous copies of `tensors` (CPU; same shapes and dtypes) side by side in one buffer from
    zeros_on_huge_pages, each at an `align`-byte boundary: many small matrices share the 2 MiB pages
    that none of them would fill alone."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // align) * align
    arena = zeros_on_huge_pages((max(total, 1),), torch.uint8)
    copies = []
    for t, start in zip(tensors, offsets, strict=True):
        nbytes = t.numel() * t.element_size()
        copy = arena[start:start + nbytes].view(t.dtype).view(t.shape)
        copy.copy_(t)
        copies.append(copy)
    return copies
