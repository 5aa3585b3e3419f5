"""The README's table of server flags is the one `python -m server.flags_table` generates, and that
table lists exactly the options of `llm-serve serve --help`."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from server.flags_table import readme_table, table

ROOT = Path(__file__).resolve().parents[2]


def _help_options(env: dict[str, str]) -> list[str]:
    """The long options `llm-serve serve --help` prints (the console command's own code path)."""
    out = subprocess.run([sys.executable, "-c", "import sys; from server.entrypoint import main; sys.exit(main())",
                          "serve", "--help"], capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    return sorted(set(re.findall(r"--[a-z][a-z0-9-]+", out)) - {"--help"})


def test_readme_table_is_the_generated_one():
    assert readme_table((ROOT / "README.md").read_text()) == table(), (
        "README.md's flags table is out of date: run `python -m server.flags_table --write README.md`")


def test_table_lists_every_option_of_serve_help():
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    in_table = sorted(set(re.findall(r"`(--[a-z][a-z0-9-]+)", table())))
    assert in_table == _help_options(env)
    assert "| `MODEL` (positional) |" in table()


def test_documented_defaults_ignore_the_environment(monkeypatch):
    """An LLM_* variable changes what --help shows as the default, never the README's table."""
    before = table()
    monkeypatch.setenv("LLM_PORT", "9999")
    monkeypatch.setenv("LLM_API_KEY", "secret-key")
    assert table() == before
    assert "9999" not in table() and "secret-key" not in table()


def test_check_command_fails_on_a_stale_table(tmp_path):
    readme = (ROOT / "README.md").read_text()
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace("| `--port PORT` | `8000` |", "| `--port PORT` | `8001` |"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = [sys.executable, "-m", "server.flags_table", "--check", str(stale)]
    failed = subprocess.run(check, capture_output=True, text=True, env=env, cwd=ROOT)
    assert failed.returncode == 1 and "--write" in failed.stderr
    subprocess.run([sys.executable, "-m", "server.flags_table", "--write", str(stale)], env=env, cwd=ROOT, check=True)
    assert subprocess.run(check, env=env, cwd=ROOT).returncode == 0
    assert stale.read_text() == readme
