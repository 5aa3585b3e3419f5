"""The load generator and the soak end to end against our real server (real model, real processes)."""
from __future__ import annotations

import json

import pytest

from loadtest.cli import main
from loadtest.soak import main as soak_main
from server_process import ServerProcess

pytestmark = pytest.mark.slow  # a real server process (and the model) per module


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


def test_soak_against_real_server(server, tmp_path):
    """A short `python -m loadtest soak`: mixed streamed, non-streamed and aborted requests, with
    the server's processes found from its port and sampled; nothing lost, back to idle."""
    rc = soak_main(["--base-url", f"{server.url}/v1", "--duration", "15", "--concurrency", "4", "--sample-interval",
                    "2", "--input-len", "40", "--output-len", "16", "--output-dir", str(tmp_path)])
    doc = json.loads((tmp_path / "soak.json").read_text())
    summary = doc["summary"]
    assert rc == 0 and doc["clean"], summary
    assert summary["lost"] == 0 and summary["errors"] == {} and summary["idle_at_end"] is True
    assert all(summary["by_kind"][kind]["ok"] > 0 for kind in ("stream", "nonstream", "abort")), summary["by_kind"]
    assert {"server", "engine", "tokenizer_worke"} <= set(summary["processes"])  # comm keeps 15 characters
    for figures in summary["processes"].values():
        assert figures["rss_mib_last"] > 0 and figures["fds_last"] > 0
    assert summary["final_gauges"]["running"] == 0 and summary["final_gauges"]["kv_usage"] == 0
    assert summary["kv_usage_max"] > 0 and len(doc["samples"]) >= 5
    assert (tmp_path / "soak.png").stat().st_size > 0
