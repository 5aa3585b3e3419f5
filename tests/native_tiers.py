"""The native kernels' ISA tiers as the tests see them (engine/native/tiers.py): each one this
machine's compiler targets is a test parameter (the `native_tier` fixture in conftest.py), run
where the CPU has its flags and skipped, with the flags named, where it has not."""
from __future__ import annotations

from types import ModuleType

import pytest

from engine.native import load_tier, tiers

BUILDABLE_TIERS = [t.name for t in tiers.buildable()]


def tier_module(name: str) -> ModuleType:
    """The module of tier `name`; skipped where this CPU cannot run it. A tier the CPU runs but
    that is not built fails (load_tier raises): a build that should have worked did not."""
    tier = tiers.BY_NAME[name]
    missing = sorted(set(tier.cpu_flags) - tiers.cpu_flags())
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)} for the {tier.name} tier")
    return load_tier(tier)
