"""The KV cache's memory on huge pages (engine/malloc.py): zeros of the asked shape and dtype,
and, where Linux lets a process ask for transparent huge pages, the buffer really on them
(its mapping's AnonHugePages in /proc/self/smaps)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from engine.malloc import HUGE_PAGE_BYTES, MMAP_THRESHOLD_BYTES, zeros_on_huge_pages
from engine.runner.kv_cache import allocate_kv_caches

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_bytes_of(tensor: torch.Tensor) -> int:
    """AnonHugePages of the mappings that overlap the tensor's memory, in bytes."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and start < hi
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1]) * 1024
    return total


def test_zeros_of_the_shape_and_dtype():
    for dtype in (torch.bfloat16, torch.float32, torch.int8):
        t = zeros_on_huge_pages((3, 1000, 16, 64), dtype)
        assert t.shape == (3, 1000, 16, 64) and t.dtype == dtype and not t.any()
    assert not zeros_on_huge_pages((5,), torch.float32).any()  # too small to advise: plain zeros


@pytest.mark.skipif(sys.platform != "linux" or not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages on this machine")
def test_kv_cache_lies_on_huge_pages():
    # above malloc's mmap threshold, as a layer's cache of the default model is (71 MB): memory of
    # its own, never touched before (a smaller buffer may reuse heap pages already on 4 KiB)
    blocks = MMAP_THRESHOLD_BYTES // (3 * 16 * 64 * 2) + 1000
    (k, v), = allocate_kv_caches(1, (3, blocks, 16, 64), torch.bfloat16, torch.device("cpu"))
    nbytes = k.numel() * k.element_size()
    for cache in (k, v):
        # all but the unaligned ends, unless the kernel had no huge page free at that moment
        assert _huge_bytes_of(cache) >= nbytes - 2 * HUGE_PAGE_BYTES, "the cache is on 4 KiB pages"
