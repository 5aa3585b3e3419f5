"""The CUDA backend's Triton kernels compile for a Hopper GPU (sm_90) here, without one
(benchmarks/triton_compile_check.py): the interpreter that runs them on a CPU in the other
tests accepts programs the compiler refuses. A fresh process, since this one's triton runs the
interpreter (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the kernels compiled for sm_90 in a fresh process

REPO = Path(__file__).resolve().parents[2]


def test_the_triton_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this Triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.triton_compile_check", "--dtypes", "bf16,fp32",
                          "--groups", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "16 kernel configurations compiled for sm_90" in run.stdout
