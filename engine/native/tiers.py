"""The native kernels' ISA tiers: what each is compiled with, what a CPU needs to run it, and which
one this process runs.

Every tier is the same C++ sources compiled with explicit flags (never -march=native) into its own
extension module, `engine.native._kernels_<name>`, at install time (setup.py), so a build made on
one x86-64 machine runs on any other. At run time the best tier whose CPU flags the host has is
taken, or the one `LLM_CPU_KERNEL_TIER` names (a lower tier than the CPU allows, to run or benchmark
it). As ggml-cpu's variants: each module is loaded with its own symbols (RTLD_LOCAL), so an inline
function compiled for AVX-512 in one tier never serves another.

This module imports nothing heavy (no torch): setup.py reads it for the build.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

from engine.cpuinfo import cpuinfo_field

CSRC = Path(__file__).with_name("csrc")
# compiled into every tier's module; the headers they include are part of the sources' hash too
SOURCES = ("bindings.cpp", "decode_attention.cpp", "rms_norm.cpp", "quant_linear.cpp", "rope_kv.cpp", "silu_mul.cpp",
           "decode_layers.cpp", "sample_draw.cpp", "int8_linear.cpp", "q4_int8_linear.cpp", "amx_linear.cpp",
           "prefill_attention.cpp", "lora_delta.cpp")
# OpenMP: at::parallel_for is inline, serial without it; no FMA contraction of plain a * b + c, so the
# scalar paths round where the torch ops they replace do (the vector paths use explicit FMAs)
COMMON_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")

FORCE_ENV = "LLM_CPU_KERNEL_TIER"
BUILD_ENV = "LLM_CPU_KERNEL_TIERS"  # setup.py: "all" (the default), "host", "none" or a comma-separated list

_AVX2 = ("-mavx2", "-mfma", "-mf16c", "-mbmi", "-mbmi2", "-mlzcnt", "-mpopcnt")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512cd")


@dataclass(frozen=True)
class Tier:
    name: str
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags a CPU needs to run it
    compile_flags: tuple[str, ...]
    bf16_compute: bool = False  # bf16 dot products in hardware: bfloat16 activations pay off
    x86: bool = True

    @property
    def module(self) -> str:
        return f"engine.native._kernels_{self.name}"

    def runs_on(self, flags: set[str]) -> bool:
        return all(f in flags for f in self.cpu_flags)


# Best first. The scalar reference runs everywhere and is every other tier's test oracle.
TIERS: tuple[Tier, ...] = (
    Tier("avx512_amx", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                        "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"),
         (*_AVX512, "-mavx512vnni", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-mamx-int8"), bf16_compute=True),
    Tier("avx512_bf16", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                         "avx512_bf16"),
         (*_AVX512, "-mavx512vnni", "-mavx512bf16"), bf16_compute=True),
    Tier("avx512_vnni", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
         (*_AVX512, "-mavx512vnni")),
    Tier("avx2", ("avx2", "fma", "f16c", "bmi2"), _AVX2),
    Tier("scalar", (), (), x86=False),
)
BY_NAME = {t.name: t for t in TIERS}


def sources_hash() -> str:
    """A digest of every source and header: built into each module, so a module older than the
    sources it was built from is seen (engine.native.load_tier warns)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def cpu_flags() -> set[str]:
    """The first processor's flags in /proc/cpuinfo (x86 Linux); empty elsewhere."""
    return set((cpuinfo_field("flags") or "").split())


def buildable() -> tuple[Tier, ...]:
    """The tiers this machine's compiler targets: all of them on x86-64, the scalar one elsewhere."""
    return TIERS if is_x86() else tuple(t for t in TIERS if not t.x86)


def runnable(flags: set[str] | None = None) -> tuple[Tier, ...]:
    """The tiers this CPU runs, best first (the scalar reference always)."""
    flags = cpu_flags() if flags is None else flags
    return tuple(t for t in buildable() if t.runs_on(flags))


def choose(flags: set[str] | None = None, forced: str | None = None) -> Tier:
    """The tier to run: `forced` (LLM_CPU_KERNEL_TIER when None) if set, else the best this CPU runs.
    A forced tier that is unknown or that this CPU cannot run is an error naming the choices."""
    forced = os.environ.get(FORCE_ENV) or None if forced is None else forced
    able = runnable(flags)
    if forced is None:
        return able[0]
    if forced not in BY_NAME:
        raise ValueError(f"{FORCE_ENV}={forced!r}: unknown tier; choose one of {', '.join(BY_NAME)}")
    if BY_NAME[forced] not in able:
        raise ValueError(f"{FORCE_ENV}={forced!r}: this CPU lacks "
                         f"{', '.join(sorted(set(BY_NAME[forced].cpu_flags) - (flags or cpu_flags())))}; it runs "
                         f"{', '.join(t.name for t in able)}")
    return BY_NAME[forced]


def to_build() -> tuple[Tier, ...]:
    """setup.py's tiers: LLM_CPU_KERNEL_TIERS = all (default: a wheel for any CPU of this
    architecture), host (those this CPU runs: a quicker development build), none (`make install`'s
    editable install, which then builds them incrementally with `make native`) or names."""
    wanted = os.environ.get(BUILD_ENV, "all").strip()
    if wanted == "all":
        return buildable()
    if wanted == "host":
        return runnable()
    if wanted == "none":
        return ()
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"{BUILD_ENV}: unknown tiers {unknown}; choose from {', '.join(BY_NAME)}")
    return tuple(t for t in buildable() if t.name in names)
