"""Native CPU kernels (a C++ extension built for this host on first use, then cached).

`kernels()` returns the compiled module, or None when it cannot be built (no compiler, a
failed build) or is turned off (`LLM_NATIVE_KERNELS=0`); callers then use their torch path,
and the reason is logged once. The engine hands the module to the layers that use it (the
attention backend, the model's RMSNorms) when `--native-kernels` is on and the device is a CPU.
The build goes to `~/.cache/llm-serve/native/<key>` where the key names the torch version, the
sources' hash and the CPU's flags, so another machine or a changed kernel builds again and
everything else loads in a second.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from pathlib import Path
from types import ModuleType

from engine.cpuinfo import cpuinfo_field

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name("csrc") / name for name in ("bindings.cpp", "decode_attention.cpp", "rms_norm.cpp",
                                                                  "quant_linear.cpp", "rope_kv.cpp",
                                                                  "silu_mul.cpp", "decode_layers.cpp",
                                                                  "sample_draw.cpp", "int8_linear.cpp",
                                                                  "q4_int8_linear.cpp", "amx_linear.cpp",
                                                                  "prefill_attention.cpp")]
# included by the sources: part of the build key
HEADERS = [Path(__file__).with_name("csrc") / name for name in ("vec16.h", "kernels.h", "decode_layers.h",
                                                                  "int8_activations.h", "kv_int8.h", "parallel.h",
                                                                  "amx_tiles.h", "prefetch.h")]
# OpenMP: at::parallel_for is inline, serial without it; no FMA contraction of plain a * b + c, so the
# scalar paths round where the torch ops they replace do (the vector paths use explicit FMAs)
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]
# AMD CPUs: streamed data prefetched into L2, where they keep more misses in flight (prefetch.h)
if cpuinfo_field("vendor_id") == "AuthenticAMD":
    CFLAGS.append("-DLLM_SERVE_PREFETCH_L2")
    # and VDPBF16PS issues at the FMA's rate with twice its products: the prefill attention's
    # products in it (prefill_attention.cpp; the Xeons issue it at half the FMA's rate)
    CFLAGS.append("-DLLM_SERVE_BF16_DOT_ATTENTION")


def _cpu_flags() -> str:
    return cpuinfo_field("flags") or platform.processor()


def build_directory() -> Path:
    import torch

    digest = hashlib.sha256()
    for source in [*SOURCES, *HEADERS]:
        digest.update(source.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    digest.update(_cpu_flags().encode())
    key = f"torch{torch.__version__}-{digest.hexdigest()[:16]}"
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-serve" / "native"
    return root / key


@functools.cache
def kernels() -> ModuleType | None:
    if os.environ.get("LLM_NATIVE_KERNELS", "1") == "0":
        logger.info("native CPU kernels off (LLM_NATIVE_KERNELS=0): torch paths")
        return None
    try:
        from torch.utils.cpp_extension import load

        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        module = load(name="llm_serve_cpu_kernels", sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS,
                      extra_ldflags=["-fopenmp"],
                      build_directory=str(directory), verbose=False)
    except Exception as exc:  # no compiler, a failed build: the torch paths still work
        logger.warning("native CPU kernels unavailable, using torch paths: %s: %s", type(exc).__name__,
                       str(exc).strip().splitlines()[-1] if str(exc).strip() else "")
        return None
    logger.info("native CPU kernels loaded from %s", directory)
    return module

