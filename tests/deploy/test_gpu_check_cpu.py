"""`deploy/gpu-check.sh --cpu`: the GPU check's script end to end on this CPU, so a broken script
(a pytest option that stops pytest, a renamed test file, a benchmark flag that no longer parses)
is found here and never on a lent GPU. The same pytest command line and plugins (pytest-timeout
is installed here, as on the CUDA machines), the same test files on their CPU parametrization
under Triton's interpreter, and `python -m benchmarks --device ...`'s own code on a tiny model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # the parity tests once more, and a small benchmark


@pytest.mark.timeout(600)  # the script's own limits: 270 s of tests, 200 s of benchmark
def test_gpu_check_rehearsed_on_the_cpu(tmp_path):
    pytest.importorskip("pytest_timeout")  # pinned in requirements-dev.txt: the plugin's path is what is checked
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    env.update(OUT=str(tmp_path), PYTHON=sys.executable)
    run = subprocess.run(["bash", "deploy/gpu-check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "already registered" not in out  # pytest-timeout loaded once
    summary = out.split("=== GPU check, rehearsed on the CPU ===", 1)[1]
    tests_line = next(line for line in summary.splitlines() if line.startswith("parity tests"))
    assert " passed" in tests_line and "failed" not in tests_line and "error" not in tests_line, tests_line
    figures = json.loads((tmp_path / "gpu-check-bench.json").read_text())
    assert set(figures["tpot_ms"]) == {"graphs", "graphs-sync", "eager"}
    assert all(ms > 0 for ms in figures["tpot_ms"].values())
    assert figures["offline"]["output_tokens"] >= 6 * 8 and figures["offline"]["tok_per_s"] > 0
    assert "tiny-qwen3's architecture, random weights" in summary
    profile = (tmp_path / "gpu-check-profile.txt").read_text()
    assert "30 decode steps of 1 sequences: by host time" in profile
    assert "10 decode steps of 6 sequences: by host time" in profile
