"""The soak's parts without a model: /proc sampling of real processes, the trend fit, the
report's verdict, and request outcomes against the fake server and against a closed port.
(The soak against our real server is in test_loadtest_real_server.py.)"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from loadtest.fake_server import FakeServerConfig, start_in_thread
from loadtest.process_stats import ProcessSample, listening_pid, process_tree, sample_tree
from loadtest.servers import free_port
from loadtest.soak import main, parse_mix
from loadtest.soak_report import Sample, report, slope_per_hour
from loadtest.soak_traffic import Outcome


def test_listening_pid_and_process_tree_of_real_processes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert listening_pid(sock.getsockname()[1]) == os.getpid()
    assert listening_pid(free_port()) is None
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"  # started: past exec, not tiny
        deadline = time.monotonic() + 10
        while child.pid not in [pid for pid, _ in process_tree(os.getpid())] and time.monotonic() < deadline:
            time.sleep(0.05)
        samples = {s.pid: s for s in sample_tree(os.getpid(), root_name="tests")}
        assert samples[os.getpid()].name == "tests" and child.pid in samples
        small = [s for s in samples.values() if not (s.rss_bytes > 1 << 20 and s.num_fds >= 3)]
        assert not small, f"processes with under 1 MiB or under 3 fds: {small}"
    finally:
        child.kill()
        child.wait()


def test_slope_per_hour():
    assert slope_per_hour([0, 1800, 3600], [100, 150, 200]) == pytest.approx(100)
    assert slope_per_hour([0, 60, 120, 180], [5, 5, 5, 5]) == pytest.approx(0)
    assert slope_per_hour([10], [1]) is None


def test_parse_mix():
    assert parse_mix("stream=1,abort=0.5") == {"stream": 1.0, "abort": 0.5}
    for bad in ("stream", "download=1", "stream=x", "stream=0", "stream=-1,abort=2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_mix(bad)


def _sample(t: float, rss_mib: float, running: float = 0, kv: float = 0.0, in_flight: int = 0) -> Sample:
    return Sample(t=t, processes=[ProcessSample(1, "engine", int(rss_mib * (1 << 20)), 17)],
                  gauges={"running": running, "waiting": 0, "kv_usage": kv}, sent=0, in_flight=in_flight, lost=0,
                  errors=0)


def test_report_verdict_and_rss_trend_after_warmup():
    # A fast rise in the warm-up (the first 10 %, at least 30 s), then flat: no growth.
    samples = [_sample(0, 100, running=4, kv=0.2), _sample(20, 400, running=4, kv=0.2)]
    samples += [_sample(t, 400, running=4, kv=0.1) for t in range(60, 600, 60)] + [_sample(600, 400)]
    ok = [Outcome("stream", "ok"), Outcome("nonstream", "ok"), Outcome("abort", "ok")]
    summary = report(samples, ok, duration_s=600)
    assert summary.clean and summary.figures["processes"]["engine"]["rss_growth_mib_per_hour"] == pytest.approx(0)
    assert summary.figures["kv_usage_max"] == 0.2 and "clean (0 lost" in summary.text
    lost = report(samples, [*ok, Outcome("stream", "lost", "ReadError: boom")], duration_s=600)
    assert not lost.clean and "lost: stream: ReadError: boom" in lost.text
    busy = report([*samples[:-1], _sample(600, 400, running=1, kv=0.01)], ok, duration_s=600)
    assert not busy.clean and "NOT back to idle" in busy.text


def test_errors_and_lost_requests_fail_the_soak(tmp_path):
    """Against the fake server: its non-streaming answer is a 400 and every third request a 503
    (errors: answers all the same); against a closed port every request is lost."""
    fake = start_in_thread(FakeServerConfig(ttft_s=0.001, itl_s=0.001, fail_every=3))
    try:
        rc = main(["--base-url", fake.base_url, "--duration", "1", "--concurrency", "2", "--sample-interval", "0.5",
                   "--output-dir", str(tmp_path / "fake")])
    finally:
        fake.stop()
    doc = json.loads((tmp_path / "fake" / "soak.json").read_text())
    assert rc == 1 and doc["clean"] is False and doc["summary"]["lost"] == 0
    assert doc["summary"]["errors"].get("http_503") and doc["summary"]["errors"].get("http_400")
    assert doc["summary"]["by_kind"]["stream"]["ok"] > 0
    closed = f"http://127.0.0.1:{free_port()}/v1"
    rc = main(["--base-url", closed, "--model", "m", "--duration", "0.5", "--concurrency", "1",
               "--sample-interval", "0.25", "--output-dir", str(tmp_path / "closed")])
    doc = json.loads((tmp_path / "closed" / "soak.json").read_text())
    assert rc == 1 and doc["summary"]["lost"] == doc["summary"]["requests"] > 0
    assert all("ConnectError" in detail for detail in doc["summary"]["lost_details"])
