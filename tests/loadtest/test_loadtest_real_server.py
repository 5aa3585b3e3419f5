"""The load generator end to end against our real server (real model, real processes)."""
from __future__ import annotations

import json

import pytest

from loadtest.cli import main
from server_process import ServerProcess


@pytest.fixture(scope="module")
def server():
    s = ServerProcess().wait_ready()
    yield s
    s.stop()


def test_sweep_against_real_server(server, tmp_path):
    out = tmp_path / "run"
    rc = main(["--base-url", f"{server.url}/v1", "--concurrency", "1,3", "--num-prompts", "3", "--input-len", "24",
               "--output-len", "6", "--ignore-eos", "--warmup", "1", "--output-dir", str(out)])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert [r["max_concurrency"] for r in doc["runs"]] == [1, 3]
    for run in doc["runs"]:
        assert run["model_id"] == "SmolLM2-135M-Instruct"  # read from GET /v1/models
        assert run["completed"] == 3 and run["failed"] == 0
        assert run["output_lens"] == [6] * 3  # from the server's usage chunk: ignore_eos honoured
        assert all(t > 0 for t in run["ttfts"])
        assert run["output_throughput"] > 0
    assert (out / "sweep.png").stat().st_size > 0
