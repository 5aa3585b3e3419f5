"""The native CPU kernels, compiled at install time: one extension module per ISA tier
(engine/native/tiers.py), each from the same sources with that tier's explicit flags. Everything
else about the package is in pyproject.toml.

`pip install .` (or `make install`, editable) builds every tier this architecture has, so the
install runs on any CPU of it; LLM_CPU_KERNEL_TIERS=host builds only those this CPU runs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from engine.native import tiers  # noqa: E402  (the tree being built, not an installed copy)


class BuildTiers(BuildExtension):
    """Each tier's objects in a folder of their own: the tiers compile the same sources, whose
    object files would otherwise share one path."""

    def build_extension(self, ext):
        base = self.build_temp
        self.build_temp = os.path.join(base, ext.name.rsplit(".", 1)[-1])
        try:
            super().build_extension(ext)
        finally:
            self.build_temp = base


def generated_header() -> Path:
    """build/generated/sources_hash.h: the sources' hash, which bindings.cpp alone includes, so a
    changed source rebuilds its own objects and the bindings, not every object of every tier. The
    file is rewritten only when the hash changes."""
    header = ROOT / "build" / "generated" / "sources_hash.h"
    text = f'#define LLM_SERVE_SOURCES_HASH "{tiers.sources_hash()}"\n'
    if not header.exists() or header.read_text() != text:
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text(text)
    return header.parent


# -g0: no debug information (a third of each compile, and of each module's size)
extensions = [
    CppExtension(tier.module, [str(Path("engine/native/csrc") / name) for name in tiers.SOURCES],
                 include_dirs=[str(generated_header())],
                 extra_compile_args=[*tiers.COMMON_FLAGS, "-g0", *tier.compile_flags,
                                     f'-DLLM_SERVE_TIER="{tier.name}"'],
                 extra_link_args=["-fopenmp"])
    for tier in tiers.to_build()
]
setup(ext_modules=extensions, cmdclass={"build_ext": BuildTiers})
