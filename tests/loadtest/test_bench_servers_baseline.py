"""`python -m loadtest.bench_servers --baseline DIR`: a folder that holds no server checkout is
refused before anything starts, with the command that makes one."""
from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.bench_servers import main


def test_a_baseline_without_a_server_is_refused_before_any_server_starts(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()  # a folder, but no server/__main__.py
    with pytest.raises(SystemExit) as refused:
        main(["--peers", "", "--baseline", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert "no server/__main__.py" in str(refused.value)
    assert "git archive" in str(refused.value)
    assert not (tmp_path / "out" / "ours.log").exists()  # checked before our server was started
