"""`python -m loadtest` end to end against local fake servers: files written, compare mode, caps.

The fake servers (loadtest.fake_server) run in threads of the test process on free 127.0.0.1
ports; the CLI runs in-process through main(argv), or as a real subprocess where the process
boundary matters (the `python -m` entry, Ctrl-C).
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.cli import main
from loadtest.client import UsageMissingWarning
from loadtest.fake_server import FakeServerConfig, start_in_thread
from loadtest.targets import is_loopback

REPO = Path(__file__).resolve().parents[2]
FAST = dict(ttft_s=0.01, itl_s=0.002)


@pytest.fixture(scope="module")
def fast_a():
    server = start_in_thread(FakeServerConfig(**FAST))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fast_b():
    server = start_in_thread(FakeServerConfig(model="other-model", ttft_s=0.03, itl_s=0.004, tokens_per_chunk=2))
    yield server
    server.stop()


def read(out_dir):
    return json.loads((out_dir / "results.json").read_text())


def test_sweep_writes_json_and_plots(fast_a, tmp_path, capsys):
    rc = main([
        "--base-url", fast_a.base_url, "--num-prompts", "4", "--concurrency", "1,2", "--input-len", "12",
        "--output-len", "5", "--ignore-eos", "--temperature", "0.5", "--top-p", "0.9", "--api-key", "k1",
        "--slo", "ttft:5000", "--output-dir", str(tmp_path),
    ])  # fmt: skip
    assert rc == 0
    doc = read(tmp_path)
    assert doc["stopped_reason"] is None
    assert doc["config"]["api_key"] == "<redacted>"
    assert doc["requests_sent"] == 1 + 2 * 4  # warmup + two levels
    assert [r["max_concurrency"] for r in doc["runs"]] == [1, 2]
    for run in doc["runs"]:
        assert run["model_id"] == "fake-model"  # from GET /models
        assert run["completed"] == 4 and run["failed"] == 0
        assert run["output_lens"] == [5] * 4 and len(run["ttfts"]) == 4
        assert all(len(itls) == 4 for itls in run["itls"])
        for key in ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms",
                    "mean_e2el_ms", "e2els", "input_lens"):  # fmt: skip
            assert run[key] is not None, key
        assert run["request_goodput"] == pytest.approx(run["request_throughput"])
    for png in ("latency_c1.png", "latency_c2.png", "sweep.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG"), png
    body = fast_a.app.state.last_body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["ignore_eos"], body["temperature"], body["top_p"], body["max_tokens"]) == (True, 0.5, 0.9, 5)
    assert fast_a.app.state.last_authorization == "Bearer k1"
    out = capsys.readouterr().out
    assert "TTFT p99 (ms)" in out and "Request goodput" in out


def test_compare_mode_subprocess_interleaves_targets(fast_a, fast_b, tmp_path):
    a_before, b_before = len(fast_a.app.state.arrivals), len(fast_b.app.state.arrivals)
    cmd = [
        sys.executable, "-m", "loadtest", "--target", f"A={fast_a.base_url}", "--target", f"B={fast_b.base_url}",
        "--num-prompts", "6", "--concurrency", "1,3", "--rounds", "2", "--output-len", "4", "--warmup", "0",
        "--endpoint", "completions", "--output-dir", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "B/A" in proc.stdout  # the ratio column
    doc = read(tmp_path)
    assert [(r["target"], r["max_concurrency"]) for r in doc["runs"]] == [("A", 1), ("B", 1), ("A", 3), ("B", 3)]
    assert [r["model_id"] for r in doc["runs"]] == ["fake-model", "other-model", "fake-model", "other-model"]
    assert all(r["completed"] == 6 for r in doc["runs"])
    assert all(r["output_lens"] == [4] * 6 for r in doc["runs"])
    # Rounds alternate: at concurrency 1, B's first request comes before A's last one.
    a_times = fast_a.app.state.arrivals[a_before:][:6]
    b_times = fast_b.app.state.arrivals[b_before:][:6]
    assert min(b_times) < max(a_times)
    assert min(a_times) < min(b_times)
    for png in ("latency_c1.png", "latency_c3.png", "sweep.png"):
        assert (tmp_path / png).exists(), png


def test_request_rate_dataset_and_max_requests(fast_a, tmp_path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "a b c", "max_tokens": 2}\n{"messages": [{"role": "user", "content": "x"}]}\n')
    out = tmp_path / "rate"
    rc = main(["--base-url", fast_a.base_url, "--request-rate", "50", "--burstiness", "0.5", "--num-prompts", "4",
               "--dataset", str(dataset), "--output-len", "3", "--warmup", "0", "--output-dir", str(out)])  # fmt: skip
    assert rc == 0
    (run,) = read(out)["runs"]
    assert run["max_concurrency"] is None and run["request_rate"] == 50.0
    assert run["output_lens"] == [2, 3, 2, 3]
    assert (out / "latency_cinf.png").exists() and not (out / "sweep.png").exists()

    capped = tmp_path / "capped"
    rc = main(["--base-url", fast_a.base_url, "--num-prompts", "4", "--concurrency", "1", "--max-requests", "3",
               "--output-dir", str(capped)])  # fmt: skip
    doc = read(capped)
    assert rc == 0 and doc["stopped_reason"] == "max_requests" and doc["requests_sent"] == 3
    assert doc["runs"][0]["completed"] == 2  # one of the 3 went to warmup


def test_max_duration_stops_and_keeps_partial_results(tmp_path):
    slow = start_in_thread(FakeServerConfig(ttft_s=0.01, itl_s=0.05))
    try:
        # 50 requests of ten 50 ms tokens two at a time need 13 s; the run stops by its own clock
        # (stopped_reason) with some done and the two in flight aborted, whatever this machine's pace
        rc = main(["--base-url", slow.base_url, "--num-prompts", "50", "--concurrency", "2", "--output-len", "10",
                   "--warmup", "0", "--max-duration", "1.5", "--output-dir", str(tmp_path)])  # fmt: skip
    finally:
        slow.stop()
    doc = read(tmp_path)
    assert rc == 0 and doc["stopped_reason"] == "max_duration"
    (run,) = doc["runs"]
    assert 0 < run["completed"] < 50 and run["aborted"] == 2


def test_ctrl_c_writes_partial_results(tmp_path):
    slow = start_in_thread(FakeServerConfig(ttft_s=0.01, itl_s=0.1))
    try:
        cmd = [sys.executable, "-m", "loadtest", "--base-url", slow.base_url, "--num-prompts", "20",
               "--concurrency", "2", "--output-len", "10", "--warmup", "0", "--output-dir", str(tmp_path)]  # fmt: skip
        # Ctrl-C's default action in the child, even where this test runs with SIGINT ignored (a
        # shell's background job): Python then installs no KeyboardInterrupt handler at all
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 30
        while slow.requests_seen < 4 and time.monotonic() < deadline:  # two finished, two in flight
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        slow.stop()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in out
    doc = read(tmp_path)
    assert doc["stopped_reason"] == "interrupted"
    assert doc["runs"][0]["completed"] >= 1 and doc["runs"][0]["aborted"] >= 1
    assert (tmp_path / "latency_c2.png").exists()


def test_remote_hosts_are_refused_without_flag(tmp_path, capsys):
    assert main(["--base-url", "http://10.1.2.3:8000/v1", "--output-dir", str(tmp_path)]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["--target", "a=http://127.0.0.1:1/v1", "--target", "b=https://example.com/v1"]) == 2
    assert not (tmp_path / "results.json").exists()
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.9.8.7", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("10.0.0.1", "example.com", "localhost.example.com", "::"))


def test_bad_arguments_exit_2(capsys):
    for argv in (["--base-url", "http://127.0.0.1:1/v1", "--concurrency", "0"],
                 ["--base-url", "http://127.0.0.1:1/v1", "--slo", "ttft"],
                 ["--base-url", "http://127.0.0.1:1/v1", "--num-prompts", "0"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2


def test_missing_usage_is_flagged_in_table_and_json(tmp_path, capsys):
    server = start_in_thread(FakeServerConfig(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=2, send_usage=False))
    try:
        with pytest.warns(UsageMissingWarning):
            rc = main(["--base-url", server.base_url, "--num-prompts", "3", "--concurrency", "3", "--output-len", "6",
                       "--warmup", "0", "--output-dir", str(tmp_path)])  # fmt: skip
    finally:
        server.stop()
    assert rc == 0
    (run,) = read(tmp_path)["runs"]
    assert run["usage_missing"] == 3
    assert run["output_lens"] == [3, 3, 3]  # 6 tokens in 3 chunks of 2: the fallback undercounts
    assert "WARNING server: 3 request(s) streamed no usage chunk" in capsys.readouterr().out
