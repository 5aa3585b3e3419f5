"""The installed commands work from any folder: `llm-serve` and `python -m loadtest` (the project
is installed into the venv by `make install`, so nothing depends on the current directory)."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def llm_serve() -> str:
    path = Path(sysconfig.get_path("scripts")) / "llm-serve"
    assert path.exists(), f"{path} missing: run `make install` (pip install --no-deps -e .)"
    return str(path)


def test_llm_serve_help_from_another_folder(llm_serve, tmp_path):
    top = run([llm_serve, "--help"], tmp_path)
    assert top.returncode == 0, top.stderr
    for command in ("serve", "bench serve", "bench servers", "bench engine"):
        assert f"\n  {command} " in top.stdout, top.stdout
    serve = run([llm_serve, "serve", "--help"], tmp_path)
    assert serve.returncode == 0 and serve.stdout.startswith("usage: llm-serve serve"), serve.stderr
    assert "--max-num-batched-tokens" in serve.stdout
    bench = run([llm_serve, "bench", "serve", "--help"], tmp_path)
    assert bench.returncode == 0 and "--concurrency" in bench.stdout, bench.stderr
    unknown = run([llm_serve, "bench", "nothing"], tmp_path)
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr


def test_python_m_loadtest_and_server_from_another_folder(tmp_path):
    for module, flag in (("loadtest", "--base-url"), ("server", "--served-model-name")):
        result = run([sys.executable, "-m", module, "--help"], tmp_path)
        assert result.returncode == 0, result.stderr
        assert flag in result.stdout
