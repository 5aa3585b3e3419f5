"""The KV cache's and the kernels' weights' memory on huge pages (engine/malloc.py): zeros of the
asked shape and dtype, copies side by side at aligned offsets, and, where Linux lets a process ask
for transparent huge pages, the buffers really on them (their mapping's AnonHugePages in
/proc/self/smaps), the engine's codes included."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from engine.malloc import HUGE_PAGE_BYTES, MMAP_THRESHOLD_BYTES, pack_on_huge_pages, zeros_on_huge_pages
from engine.runner.kv_cache import allocate_kv_caches

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(sys.platform != "linux" or not THP.exists() or "[never]" in THP.read_text(),
                               reason="no transparent huge pages on this machine")


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


@needs_thp
def test_kv_cache_lies_on_huge_pages():
    # above malloc's mmap threshold, as a layer's cache of the default model is (71 MB): memory of
    # its own, never touched before (a smaller buffer may reuse heap pages already on 4 KiB)
    blocks = MMAP_THRESHOLD_BYTES // (3 * 16 * 64 * 2) + 1000
    (k, v), = allocate_kv_caches(1, (3, blocks, 16, 64), torch.bfloat16, torch.device("cpu"))
    nbytes = k.numel() * k.element_size()
    for cache in (k, v):
        # all but the unaligned ends, unless the kernel had no huge page free at that moment
        assert _huge_bytes_of(cache) >= nbytes - 2 * HUGE_PAGE_BYTES, "the cache is on 4 KiB pages"


def test_packed_copies_lie_side_by_side():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randint(0, 256, (1000, 2, 9), generator=g, dtype=torch.uint8), torch.randn(7, generator=g).half(),
               torch.empty(0, dtype=torch.float16), torch.randn(3, 5, generator=g),
               torch.randint(-128, 128, (600_000,), generator=g, dtype=torch.int8)]
    copies = pack_on_huge_pages(tensors)
    for t, c in zip(tensors, copies, strict=True):
        assert c.dtype == t.dtype and c.shape == t.shape and c.is_contiguous() and torch.equal(c, t)
    starts = [c.data_ptr() for c in copies if c.numel()]
    assert all(p % 64 == 0 for p in starts) and starts == sorted(starts)
    assert starts[-1] - starts[0] < 18_000 + 64 * 4 + 60 + 64  # one buffer, the copies one after the other


@needs_thp
def test_engine_codes_lie_on_huge_pages():
    from common.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.models.linear import Linear

    engine = LLMEngine(EngineConfig(dtype="bfloat16", device="cpu", kv_cache_memory=16 << 20, max_model_len=256,
                                    max_num_seqs=4))
    methods = [m.method for m in engine.model.modules() if isinstance(m, Linear)]
    tensors = [t for m in methods for k in m.kernel_methods() for t in k.kernel_tensors().values() if t.numel()]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    assert engine.quantized and nbytes > 90e6  # the codes of every layer and the LM head, the batch method's too
    # one buffer holds them all, on huge pages but for its unaligned ends
    assert _huge_bytes_of(tensors[0]) >= nbytes - 2 * HUGE_PAGE_BYTES
    assert max(t.data_ptr() for t in tensors) - min(t.data_ptr() for t in tensors) < nbytes
