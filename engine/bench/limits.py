"""Measure this machine's limits in the same run as a benchmark: memory read bandwidth and
GEMM rate. Both are best-of-N, since a shared machine only ever slows a run down."""
from __future__ import annotations

import time

import torch


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def memory_bandwidth(device: torch.device, num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s for one streaming read of a buffer far larger than any cache (a sum)."""
    x = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)

    def read():
        x.sum()
        if device.type == "cuda":
            torch.cuda.synchronize()

    return num_bytes / _best_seconds(read, repeats)


def gemm_flops(dtype: torch.dtype, device: torch.device, m: int = 2048, k: int = 2048, n: int = 2048,
               repeats: int = 5) -> float:
    """FLOP/s of a large matmul in `dtype` (the compute roof for batched decode)."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)

    def mm():
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()

    return 2 * m * k * n / _best_seconds(mm, repeats)
