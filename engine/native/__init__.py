"""Native CPU kernels: one extension module per ISA tier, compiled at install time (setup.py), the
tier chosen at run time (engine/native/tiers.py).

`kernels()` returns the module of the tier this process runs (the best one the CPU has, or the one
LLM_CPU_KERNEL_TIER names), or None when the kernels are turned off (`LLM_NATIVE_KERNELS=0`) or
that tier was not built (an install without a compiler); callers then use their torch paths, and
the reason is logged once. The platform (engine/platform.py) asks for it once and hands the
module to the layers. `load_tier(name)` loads any tier, for the tests that run every tier the CPU
has against the scalar reference.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
from types import ModuleType

from engine.native.tiers import BY_NAME, FORCE_ENV, Tier, choose, sources_hash

logger = logging.getLogger(__name__)


class TierNotBuilt(ImportError):
    """The tier's module is not installed: built without it (LLM_CPU_KERNEL_TIERS), or not built."""


def load_tier(tier: Tier | str) -> ModuleType:
    """The tier's module. A module built from other sources than these (an editable install whose
    C++ changed since) is loaded, with a warning: rebuild it with `make native`."""
    tier = BY_NAME[tier] if isinstance(tier, str) else tier
    import torch  # noqa: F401  (the modules link against libtorch, which must be loaded first)

    try:
        module = importlib.import_module(tier.module)
    except ModuleNotFoundError as exc:
        raise TierNotBuilt(f"the {tier.name} kernel tier is not built ({exc}): reinstall (`make install`, "
                           f"`pip install .`) with a C++ compiler") from exc
    if module.sources_hash != sources_hash():
        _warn_stale(tier.name)
    return module


@functools.cache
def _warn_stale(name: str) -> None:
    logger.warning("the %s kernel tier was built from other sources than engine/native/csrc holds now: "
                   "`make native` rebuilds it", name)


@functools.cache
def kernels() -> ModuleType | None:
    if os.environ.get("LLM_NATIVE_KERNELS", "1") == "0":
        logger.info("native CPU kernels off (LLM_NATIVE_KERNELS=0): torch paths")
        return None
    tier = choose()
    try:
        module = load_tier(tier)
    except TierNotBuilt as exc:
        logger.warning("native CPU kernels unavailable, using torch paths: %s", exc)
        return None
    logger.info("kernel tier %s", describe(tier))
    return module


def describe(tier: Tier) -> str:
    """`avx2 (CPU flags avx2 fma f16c bmi2; forced by LLM_CPU_KERNEL_TIER)`: the tier and what chose it."""
    why = f"forced by {FORCE_ENV}" if os.environ.get(FORCE_ENV) else "the best this CPU runs"
    flags = " ".join(tier.cpu_flags) or "none needed"
    return f"{tier.name} (CPU flags {flags}; {why})"
