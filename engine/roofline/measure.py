"""This host's roofs, measured once and cached: memory read bandwidth and the GEMM rate of a dtype.

The server needs them at start-up (the engine's per-step roofline), so they live here, beside the
roofline, and the benchmarks import them from here. `memory_bandwidth` and `gemm_flops` are
best-of-N (a shared machine only ever slows a run down); `measured_limits` runs them at sizes
small enough to finish in well under 2 s on a CPU (a 256 MiB read, past any last-level cache; a
1024^3 matmul) and large enough to reach the roofs on a GPU (1 GiB, 8192^3). The result is kept
in `$XDG_CACHE_HOME/llm-serve/machine_limits.json` (else `~/.cache/llm-serve/`), one entry per
key: the CPU model (or CUDA device) name, torch version, thread count and dtype, since each of
them moves the roofs. A cache that cannot be read is measured again; one that cannot be written
is skipped.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from engine.cpuinfo import cpuinfo_field
from engine.roofline.machine import MachineLimits

logger = logging.getLogger(__name__)


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


# device type -> (bytes read, GEMM side, repeats)
SIZES = {"cpu": (256 << 20, 1024, 3), "cuda": (1 << 30, 8192, 5)}


def default_cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "llm-serve" / "machine_limits.json"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpuinfo_field("model name") or "unknown CPU"


def cache_key(device: torch.device, dtype: torch.dtype) -> str:
    return (f"{device_name(device)} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"{str(dtype).removeprefix('torch.')}")


def measure(device: torch.device, dtype: torch.dtype) -> MachineLimits:
    num_bytes, side, repeats = SIZES.get(device.type, SIZES["cpu"])
    bandwidth = memory_bandwidth(device, num_bytes, repeats)
    flops = gemm_flops(dtype, device, side, side, side, repeats)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the buffers back before the KV cache is sized
    return MachineLimits(flops, bandwidth, f"{device_name(device)} {str(dtype).removeprefix('torch.')}, measured")


def measured_limits(device: torch.device, dtype: torch.dtype, cache_path: Path | None = None) -> MachineLimits:
    """The cached roofs of this host for `dtype`, measured on a miss."""
    path = default_cache_path() if cache_path is None else cache_path
    key = cache_key(device, dtype)
    entries = _read(path)
    entry = entries.get(key)
    if isinstance(entry, dict):
        try:
            return MachineLimits(float(entry["peak_flops"]), float(entry["bandwidth_bytes_per_s"]), str(entry["name"]))
        except (KeyError, TypeError, ValueError):
            pass  # a damaged entry: measure again
    started = time.perf_counter()
    limits = measure(device, dtype)
    logger.info("%s measured in %.2f s (cached in %s)", limits.describe(), time.perf_counter() - started, path)
    entries[key] = {"peak_flops": limits.peak_flops, "bandwidth_bytes_per_s": limits.bandwidth_bytes_per_s,
                    "name": limits.name}
    _write(path, entries)
    return limits


def _read(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write(path: Path, entries: dict) -> None:
    """Replace the file whole (a temporary sibling renamed), so a reader never sees half of it."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".limits-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        logger.debug("machine limits not cached at %s: %s", path, exc)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
