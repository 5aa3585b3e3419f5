"""`llm:detokenize_mismatch_total` on /metrics: zero after real requests (streamed and not, n=2,
stop strings, CJK and emoji), counted when the worker flags a delta, and switched by a flag."""
from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.ipc import IpcPaths
from common.messages import TextDelta, TextOutputs
from server.config import parse_args
from server.metrics import ServerMetrics
from server.worker_client import WorkerClient
from server_process import stream_post

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"
COUNTER = "llm:detokenize_mismatch_total"


def mismatches(metrics_text: str) -> float:
    return next(s.value for family in text_string_to_metric_families(metrics_text) for s in family.samples
                if s.name == COUNTER)


def test_no_mismatch_after_real_requests(default_server):
    url = default_server.url
    text = httpx.get(f"{url}/metrics", timeout=10).text
    assert re.search(rf'^{COUNTER}{{model_name="{MODEL}"}} 0\.0$', text, re.M), text
    before = mismatches(text)
    chat = {"model": MODEL, "max_tokens": 48, "messages": [
        {"role": "user", "content": "Translate to Chinese and add emoji: good morning, my friend 🙂"}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    stream_post(f"{url}/v1/chat/completions", {**chat, "stream": True, "n": 2, "temperature": 1.0, "seed": 3})
    events = stream_post(f"{url}/v1/completions", {
        "model": MODEL, "prompt": "日本語で自己紹介: 私は", "max_tokens": 40, "stream": True, "temperature": 1.2,
        "seed": 7, "stop": ["。", "\n\n"]})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"])  # it streamed some text
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "Emoji list: 🙂", "max_tokens": 30,
                                                   "temperature": 1.5, "seed": 1, "skip_special_tokens": False},
                   timeout=120)
    assert r.status_code == 200, r.text
    assert mismatches(httpx.get(f"{url}/metrics", timeout=10).text) == before == 0


def test_a_flagged_delta_is_counted_even_when_its_client_left():
    metrics = ServerMetrics(MODEL)
    paths = IpcPaths.create()
    client = WorkerClient(paths, metrics, max_in_flight_seqs=4)
    try:
        flagged = TextDelta("gone", 0, "x", 1, "stop", detokenize_mismatch=True)
        client._dispatch(TextOutputs([flagged, TextDelta("gone", 1, "y", 1, "stop")]))
        assert mismatches(metrics.render().decode()) == 1
    finally:
        client.close()
        paths.remove()


def test_the_check_has_a_server_flag():
    assert parse_args([])[0].detokenize_check is True
    assert parse_args(["--no-detokenize-check"])[0].detokenize_check is False
