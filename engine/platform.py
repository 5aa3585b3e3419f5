"""Every per-device decision in one place: device and dtype, threads, what the CPU can do, the
native kernels' ISA tier, the KV cache's memory budget, the attention backend and the linear
method. The engine asks its `Platform` and logs the choices once at start-up (vLLM's
`current_platform`, in small).

The development machines vary between CPUs (an Intel Xeon with AMX, AMD Zen 4 / Zen 5 with AVX-512
BF16 and VNNI but no AMX, AMD Zen 3 with AVX2 only), so the CPU's features are detected, never
assumed: the kernel tier is the best one the CPU runs (engine/native/tiers.py), and `--dtype
auto` takes bfloat16 only where that tier has bf16 dot products in hardware, float32 elsewhere
(without them every bf16 product is a conversion and torch's bf16 matmuls crawl).
"""
from __future__ import annotations

import abc
import logging
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from common.engine_config import EngineConfig
from engine.host_limits import available_host_memory, limit_torch_threads
from engine.malloc import keep_freed_memory
from engine.models.linear import LinearMethod, OneDnnPackedMethod
from engine.native import describe as describe_tier
from engine.native import kernels
from engine.native.tiers import Tier, choose, cpu_flags

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Like vLLM's CPU backend: more KV cache is seldom usable by a CPU and costs seconds to zero.
CPU_KV_CACHE_MAX_BYTES = 4 << 30


@dataclass(frozen=True)
class CpuFeatures:
    isa: str  # torch's view of the vector unit: "AVX512", "AVX2", "DEFAULT", ...
    avx512_bf16: bool
    avx512_vnni: bool
    amx_bf16: bool
    amx_int8: bool
    onednn_bf16: bool  # oneDNN has a bf16 path on this CPU (AVX512-BF16 or AMX)

    @classmethod
    def detect(cls) -> CpuFeatures:
        flags = cpu_flags()
        return cls(isa=torch.backends.cpu.get_cpu_capability(), avx512_bf16="avx512_bf16" in flags,
                   avx512_vnni="avx512_vnni" in flags, amx_bf16="amx_bf16" in flags, amx_int8="amx_int8" in flags,
                   onednn_bf16=torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())

    def describe(self) -> str:
        names = [n for n, on in (("avx512_bf16", self.avx512_bf16), ("avx512_vnni", self.avx512_vnni),
                                 ("amx_bf16", self.amx_bf16), ("amx_int8", self.amx_int8)) if on]
        return f"{self.isa} ({', '.join(names) or 'no bf16/int8 extensions'})"


class Platform(abc.ABC):
    attention_backend = "torch-paged"

    def __init__(self, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype

    native: ModuleType | None = None  # the native CPU kernels' module (the CPU platform's tier)

    @staticmethod
    def create(device_name: str, dtype_name: str, native_kernels: bool = True) -> Platform:
        device = resolve_device(device_name)
        if device.type == "cuda":
            return CudaPlatform(device, resolve_dtype(dtype_name, device))
        tier = choose()
        return CpuPlatform(device, resolve_dtype(dtype_name, device, bf16_compute=tier.bf16_compute), tier,
                           native_kernels, explicit_dtype=dtype_name != "auto")

    def choose_attention_backend(self, requested: str) -> str:
        """--attention-backend: auto takes the platform's; triton-paged needs CUDA or, on a CPU,
        Triton's interpreter (the kernels' tests)."""
        if requested == "auto":
            return self.attention_backend
        if requested == "triton-paged" and self.device.type != "cuda" and not triton_interpreted():
            raise ValueError("--attention-backend triton-paged needs a CUDA device (on a CPU it runs only under "
                             "Triton's interpreter, TRITON_INTERPRET=1)")
        self.attention_backend = requested
        return requested

    @abc.abstractmethod
    def configure_host(self) -> None:
        """Set up the host process for this device: thread pool, allocator."""

    @abc.abstractmethod
    def available_memory(self) -> int:
        """Bytes the engine may still allocate on its device."""

    @abc.abstractmethod
    def kv_cache_budget(self, config: EngineConfig, activation_bytes: int = 0) -> int:
        """Bytes for the KV cache: --kv-cache-memory when given, else the device's default share
        (`activation_bytes`: the largest step's peak, engine/runner/profile_run.py, where measured)."""

    def linear_method(self, batch_hint: int) -> LinearMethod:
        return LinearMethod()

    def describe(self, batch_hint: int) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return (f"{self.device} {dtype}: attention {self.attention_backend}, "
                f"linears {self.linear_method(batch_hint).name}")


class CpuPlatform(Platform):
    def __init__(self, device: torch.device, dtype: torch.dtype, tier: Tier, native_kernels: bool = True,
                 explicit_dtype: bool = True):
        super().__init__(device, dtype)
        self.features = CpuFeatures.detect()
        self.keeps_freed_memory = False
        self.tier = tier
        self.native = kernels() if native_kernels else None
        # float32 because it was asked for (its precision: no int8 batches unless named), or
        # because the CPU has no bf16 arithmetic (then the batches' kernel is the CPU's choice)
        self.float32_asked = explicit_dtype and dtype == torch.float32

    def configure_host(self) -> None:
        limit_torch_threads()
        self.keeps_freed_memory = keep_freed_memory()

    def available_memory(self) -> int:
        return available_host_memory()

    def kv_cache_budget(self, config: EngineConfig, activation_bytes: int = 0) -> int:
        if config.kv_cache_memory is not None:
            return config.kv_cache_memory
        return min(int(self.available_memory() * config.cpu_kv_cache_fraction), CPU_KV_CACHE_MAX_BYTES)

    def linear_method(self, batch_hint: int) -> LinearMethod:
        # oneDNN's packed weights read 1.5-2x faster than torch's default path for decode-sized
        # matmuls (`python -m benchmarks` measures the whole engine); bf16 needs oneDNN's bf16
        # path (AVX512-BF16 or AMX), float32 runs packed everywhere oneDNN does.
        if not torch.backends.mkldnn.is_available():
            return LinearMethod()
        if self.dtype == torch.float32 or (self.dtype == torch.bfloat16 and self.features.onednn_bf16):
            return OneDnnPackedMethod(batch_hint)
        return LinearMethod()

    def describe(self, batch_hint: int) -> str:
        heap = "freed memory kept" if self.keeps_freed_memory else "default malloc"
        native = f"kernel tier {describe_tier(self.tier)}" if self.native is not None else "native kernels off"
        return (f"{super().describe(batch_hint)}; CPU {self.features.describe()}, {native}, "
                f"{torch.get_num_threads()} threads, {heap}")


class CudaPlatform(Platform):
    def __init__(self, device: torch.device, dtype: torch.dtype):
        super().__init__(device, dtype)
        # Triton ships with CUDA builds of torch; without it the torch ops still run
        self.attention_backend = "triton-paged" if triton_available() else "torch-paged"

    def configure_host(self) -> None:
        pass  # the host threads only launch kernels and tensors live on the device: defaults are fine

    def available_memory(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.device)
        return free

    def kv_cache_budget(self, config: EngineConfig, activation_bytes: int = 0) -> int:
        """vLLM's rule: the utilization's share of the whole device, less what is in use now (the
        weights, the CUDA context, other processes) and the largest step's activations."""
        if config.kv_cache_memory is not None:
            return config.kv_cache_memory
        free, total = torch.cuda.mem_get_info(self.device)
        return max(0, int(total * config.gpu_memory_utilization) - (total - free) - activation_bytes)

    def describe(self, batch_hint: int) -> str:
        return f"{super().describe(batch_hint)}; {torch.cuda.get_device_name(self.device)}"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but CUDA is not available")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}: use cpu, cuda or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, bf16_compute: bool = True) -> torch.dtype:
    if name == "auto":
        # bfloat16 on CUDA and on CPUs whose kernel tier has bf16 dot products (AVX512-BF16, AMX):
        # it halves the activations' and the KV cache's bytes, and their batched matmuls run
        # faster. Elsewhere float32: without those instructions bf16 costs a conversion per value.
        return torch.bfloat16 if device.type == "cuda" or bf16_compute else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of {sorted(_DTYPES)} or auto")
    if name == "float16" and device.type == "cpu":
        raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
    return _DTYPES[name]


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreted() -> bool:
    """Triton kernels run on CPU tensors through the interpreter (set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1" and triton_available()

