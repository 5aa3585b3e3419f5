"""Everything in common/ imports without torch: the server process must never load it."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import common


def test_every_common_module_imports_without_torch():
    names = [f"common.{m.name}" for m in pkgutil.iter_modules([str(Path(common.__file__).parent)])]
    code = f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
