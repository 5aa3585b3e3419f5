"""Many streams at once against the real server: unicode deltas, batching, disconnects."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_process import parse_sse, stream_post

pytestmark = pytest.mark.slow  # the real server process (and the model)

REPLACEMENT_CHAR = "\ufffd"


@pytest.fixture(scope="module")
def server(default_server):  # the default settings: the server the other test files share
    return default_server


def engine_gauges(server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")}


def aborted_count(server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return next(s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == "vllm:request_success_total" and s.labels["finished_reason"] == "abort")


def wait_until_idle(server, aborted: float, timeout: float = 10.0) -> dict[str, float]:
    """Gauges once the engine is idle and `aborted` aborts were counted (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = engine_gauges(server)
        done = all(v == 0 for v in gauges.values()) and aborted_count(server) >= aborted
        if done or time.monotonic() > deadline:
            return gauges
        time.sleep(0.1)


@pytest.mark.parametrize("endpoint, body", [
    ("chat/completions", {"messages": [{"role": "user", "content": "用中文回答：你好吗？"}], "max_tokens": 8}),
    ("completions", {"prompt": "北京是中国的首都。上海是", "max_tokens": 12}),
    ("completions", {"prompt": "Emoji list: 😀 😃 😄 😁 😆 😅", "max_tokens": 12}),
])
def test_multibyte_output_never_streams_a_broken_character(server, endpoint, body):
    url = f"{server.url}/v1/{endpoint}"
    body = {**body, "temperature": 0}
    full = httpx.post(url, json=body, timeout=120).json()["choices"][0]
    full_text = full["message"]["content"] if endpoint.startswith("chat") else full["text"]
    assert sum(ord(c) > 0x2E80 for c in full_text) >= 4, full_text  # CJK or emoji: multi-token characters
    chunks = stream_post(url, {**body, "stream": True})
    deltas = [c["choices"][0]["delta"].get("content") if endpoint.startswith("chat") else c["choices"][0]["text"]
              for c in chunks]
    deltas = [d for d in deltas if d]
    assert "".join(deltas) == full_text
    # Only a choice cut by max_tokens in the middle of a character may end in one U+FFFD, in the
    # final flush (the concatenation must equal the full decode); no other delta may hold one.
    assert all(REPLACEMENT_CHAR not in d for d in deltas[:-1])
    assert REPLACEMENT_CHAR not in deltas[-1].rstrip(REPLACEMENT_CHAR)


async def _stream_text(http: httpx.AsyncClient, url: str, body: dict) -> str:
    async with http.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        chunks = parse_sse(await response.aread())
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_16_concurrent_streams_equal_the_same_requests_one_by_one(server):
    url = f"{server.url}/v1/chat/completions"
    bodies = [{"messages": [{"role": "user", "content": f"Tell me a fact about the number {i}."}],
               "temperature": 0, "max_tokens": 8} for i in range(16)]
    one_by_one = [httpx.post(url, json=b, timeout=120).json()["choices"][0]["message"]["content"] for b in bodies]

    async def all_at_once():
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(_stream_text(http, url, {**b, "stream": True}) for b in bodies))

    concurrent = asyncio.run(all_at_once())
    assert concurrent == one_by_one
    assert len(set(one_by_one)) > 1


async def _read_first_content_then_leave(http: httpx.AsyncClient, url: str, body: dict) -> None:
    async with http.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return  # leaving the block closes the connection mid-stream


def test_8_clients_disconnecting_mid_stream_free_the_engine(server):
    url = f"{server.url}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 1000,
            "ignore_eos": True, "temperature": 0, "stream": True}

    async def run():
        async with httpx.AsyncClient(timeout=120) as http:
            await asyncio.gather(*(_read_first_content_then_leave(http, url, body) for _ in range(8)))

    aborted_before = aborted_count(server)
    asyncio.run(run())
    # 1000 tokens each would take minutes on this machine; aborted, they are gone at once.
    gauges = wait_until_idle(server, aborted_before + 8)
    assert gauges == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0, "vllm:kv_cache_usage_perc": 0}
    assert aborted_count(server) == aborted_before + 8


def test_non_streaming_client_that_leaves_is_aborted(server):
    url = f"{server.url}/v1/completions"
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    aborted_before = aborted_count(server)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 2 s and closes the connection
        httpx.post(url, json=body, timeout=httpx.Timeout(120, read=2.0))
    gauges = wait_until_idle(server, aborted_before + 1)
    assert gauges["vllm:num_requests_running"] == 0 and gauges["vllm:kv_cache_usage_perc"] == 0
    assert aborted_count(server) == aborted_before + 1
