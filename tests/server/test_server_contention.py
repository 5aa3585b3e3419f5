"""The disconnect storm and the SIGTERM drain while other processes keep every core busy.

A CPU hog per core (tests/server/cpu_hog.py, running until the test ends) at the server's priority, so
the server, the tokenizer worker and the engine get a fraction of the machine and each engine
step takes several times longer than alone. Both must still hold: every stream that stays ends
with its finish chunk and [DONE], the engine is idle once the storm is over, and the drain ends
by its deadline (the requests left get a 503 that says why) with exit status 0. Nothing here is
timed: that the hogs competed is their CPU time counted, and that the drain ended at its deadline
is the reason the server gives the requests it cut.
"""
from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from cpu_hog import competed, cpu_hogs, cpu_ticks
from server_process import health_once_not_ok, parse_sse, start_server

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

DRAIN_TIMEOUT_S = 20
STORM_CLIENTS, STORM_KEPT, KEPT_TOKENS = 32, 8, 12
PROMPT = [{"role": "user", "content": "Write a long story about a dragon."}]
LONG = {"messages": PROMPT, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    s = start_server("--drain-timeout", str(DRAIN_TIMEOUT_S))
    yield s
    s.stop()


def gauges(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in names}


async def _storm_client(http: httpx.AsyncClient, url: str, keep: bool) -> bytes | int:
    """A kept client reads its whole stream (returned raw); a dropping one leaves after two
    events (the role chunk and the first text) and returns how many it read."""
    body = {"messages": PROMPT, "max_tokens": KEPT_TOKENS if keep else 1000, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", url, json=body) as response:
        assert response.status_code == 200, await response.aread()
        if keep:
            return await response.aread()
        events = 0
        async for line in response.aiter_lines():
            events += line.startswith("data: ")
            if events == 2:
                return events  # leaving the block closes the connection mid-stream
    return events


def test_disconnect_storm_under_cpu_contention(server):
    url = f"{server.url}/v1/chat/completions"

    async def storm():
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=STORM_CLIENTS)) as http:
            keep = [i % (STORM_CLIENTS // STORM_KEPT) == 0 for i in range(STORM_CLIENTS)]
            return await asyncio.gather(*(_storm_client(http, url, k) for k in keep))

    with cpu_hogs() as hogs:
        ticks = [cpu_ticks(hog) for hog in hogs]
        results = asyncio.run(storm())
        assert competed(hogs, ticks), "the hogs did not run through the storm: no contention was tested"
    kept = [parse_sse(r) for r in results if isinstance(r, bytes)]
    dropped = [r for r in results if not isinstance(r, bytes)]
    assert len(kept) == STORM_KEPT and dropped == [2] * (STORM_CLIENTS - STORM_KEPT)
    for chunks in kept:  # parse_sse checked the [DONE] at the end
        assert chunks[-2]["choices"][0]["finish_reason"] == "length", chunks[-2]
        assert chunks[-1]["usage"]["completion_tokens"] == KEPT_TOKENS
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text, chunks
    assert len({"".join(c["choices"][0]["delta"].get("content") or "" for c in k if c["choices"]) for k in kept}) == 1
    deadline = time.monotonic() + 30
    while (idle := gauges(server.url)) and any(idle.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(idle.values()), f"engine not idle after the storm: {idle}"


def test_sigterm_drain_under_cpu_contention_ends_by_its_deadline(server):
    """Runs last: the server exits. At SIGTERM three requests run: a short stream, which must
    finish normally, and a long stream and a long non-streaming request, which outlive the
    drain: at its deadline they get a 503 with the reason (the stream as its last event before
    [DONE]), and the server exits with status 0."""
    url = f"{server.url}/v1/chat/completions"

    async def run():
        async with httpx.AsyncClient(timeout=300) as http:
            non_streaming = asyncio.ensure_future(http.post(url, json=LONG))
            async with http.stream("POST", url, json={**LONG, "stream": True}) as long_stream, \
                    http.stream("POST", url, json={**LONG, "max_tokens": 6, "stream": True}) as short_stream:
                long_lines, short_lines = long_stream.aiter_lines(), short_stream.aiter_lines()
                long_read = [await _first_text(long_lines)]
                short_read = [await _first_text(short_lines)]
                server.proc.send_signal(signal.SIGTERM)
                short_read += [line async for line in short_lines]
                await health_once_not_ok(http, server.url, timeout_s=10)  # the signal handled
                refused = await http.post(url, json={**LONG, "max_tokens": 2})
                long_read += [line async for line in long_lines]
            return short_read, long_read, refused, await non_streaming

    with cpu_hogs() as hogs:
        ticks = [cpu_ticks(hog) for hog in hogs]
        short_read, long_read, refused, non_streaming = asyncio.run(run())
        exit_code = server.wait_exit(timeout=DRAIN_TIMEOUT_S + 120)  # a bound for a hung server, not a measurement
        assert competed(hogs, ticks), "the hogs did not run through the drain: no contention was tested"
    short = parse_sse(("\n".join(short_read) + "\n").encode())
    assert short[-1]["choices"][0]["finish_reason"] == "length"
    long = parse_sse(("\n".join(long_read) + "\n").encode())
    error = long[-1]["error"]
    assert error["code"] == "drain_timeout" and error["type"] == "service_unavailable", error
    assert f"drain timeout ({DRAIN_TIMEOUT_S} s)" in error["message"]
    assert all("error" not in c for c in long[:-1])
    assert non_streaming.status_code == 503 and non_streaming.json()["error"]["code"] == "drain_timeout"
    assert non_streaming.headers["retry-after"].isdigit()
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    assert exit_code == 0


async def _first_text(lines) -> str:
    """The lines up to the first event with text, joined (the role chunk comes before it)."""
    read = []
    async for line in lines:
        read.append(line)
        if '"content":"' in line and '"content":""' not in line:
            return "\n".join(read)
    raise AssertionError(f"the stream ended without text: {read}")
