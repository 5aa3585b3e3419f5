"""API key, the queue limit, the SIGTERM drain, and child processes killed with SIGKILL."""
from __future__ import annotations

import asyncio
import os
import signal

import httpx
import openai
import pytest

from server_process import health_once_not_ok, parse_sse, start_server

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 1000,
        "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    """Two running sequences at most, one more may wait: the fourth concurrent one gets 503."""
    s = start_server("--api-key", KEY, "--max-num-seqs", "2", "--max-queued-requests", "1")
    yield s
    s.stop()


async def first_content(lines_iter) -> list[str]:
    """Read SSE lines until the first non-empty content; return the lines read."""
    lines = []
    async for line in lines_iter:
        lines.append(line)
        if '"content":"' in line and '"content":""' not in line:
            return lines
    raise AssertionError(f"stream ended without content: {lines}")


def test_api_key(server):
    url = server.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {KEY}x"},
                    {"Authorization": KEY}):
        response = httpx.get(f"{url}/v1/models", headers=headers)
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    # The key is checked before anything else, even before the body is parsed.
    assert httpx.post(f"{url}/v1/chat/completions", content=b"{not json").status_code == 401
    assert httpx.post(f"{url}/tokenize", json={"prompt": "hi"}).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/metrics").status_code == 200
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    out = good.chat.completions.create(model="SmolLM2-135M-Instruct", messages=LONG["messages"], max_tokens=2)
    assert out.usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


def test_queue_limit_gives_503_with_retry_after(server):
    url = f"{server.url}/v1/chat/completions"

    async def run():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as http:
            streams = [http.stream("POST", url, json={**LONG, "stream": True}) for _ in range(3)]
            responses = [await s.__aenter__() for s in streams]  # admitted: 2 running + 1 waiting
            try:
                assert [r.status_code for r in responses] == [200, 200, 200]
                refused = await http.post(url, json={**LONG, "max_tokens": 2})
                assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
                assert refused.json()["error"]["code"] == 503
            finally:
                for s in streams:
                    await s.__aexit__(None, None, None)  # disconnect: the engine aborts them

    asyncio.run(run())
    ok = httpx.post(url, json={**LONG, "max_tokens": 2}, headers=AUTH, timeout=120)
    assert ok.status_code == 200
    # More choices than the server ever holds at once: not a reason to retry, a 400.
    too_many = httpx.post(url, json={**LONG, "max_tokens": 2, "n": 4}, headers=AUTH, timeout=120)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"


def test_sigterm_drains_running_requests_and_refuses_new_ones(server):
    """Runs last in this module: the server is gone afterwards. A long stream keeps the drain
    open while a short one, running at SIGTERM, has to finish normally."""
    url = f"{server.url}/v1/chat/completions"

    async def run():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as http:
            async with http.stream("POST", url, json={**LONG, "stream": True}) as long_response, \
                    http.stream("POST", url, json={**LONG, "max_tokens": 12, "stream": True}) as short_response:
                long_lines = long_response.aiter_lines()
                await first_content(long_lines)
                short_lines = short_response.aiter_lines()
                lines = await first_content(short_lines)
                server.proc.send_signal(signal.SIGTERM)
                async for line in short_lines:
                    lines.append(line)
                # the short stream can end before the server has handled the signal
                health = await health_once_not_ok(http, server.url, timeout_s=10)
                refused = await http.post(url, json={**LONG, "max_tokens": 2})
            # Leaving the block disconnects the long stream: nothing runs, the drain ends.
        return health, refused, "\n".join(lines) + "\n"

    health, refused, body = asyncio.run(run())
    chunks = parse_sse(body.encode())  # the short stream finished normally, [DONE] included
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert health.status_code == 503
    assert refused.status_code == 503 and "retry-after" in refused.headers
    assert server.wait_exit(timeout=30) == 0


@pytest.mark.parametrize("victim", ["engine", "tokenizer_worker"])
def test_child_killed_with_sigkill(victim):
    server = start_server()
    try:
        _check_child_death(server, victim[:15])  # the kernel keeps 15 characters of a process name
    finally:
        server.stop()


def _check_child_death(server, comm: str) -> None:
    url = f"{server.url}/v1/chat/completions"
    other = server.child_pid("tokenizer_worke" if comm == "engine" else "engine")

    async def run():
        async with httpx.AsyncClient(timeout=60) as http:
            waiting = asyncio.ensure_future(http.post(url, json=LONG))
            async with http.stream("POST", url, json={**LONG, "stream": True}) as response:
                lines_iter = response.aiter_lines()
                lines = await first_content(lines_iter)
                os.kill(server.child_pid(comm), signal.SIGKILL)
                health = await health_once_not_ok(http, server.url)
                async for line in lines_iter:
                    lines.append(line)
            return health, await waiting, "\n".join(lines) + "\n"

    health, non_streaming, body = asyncio.run(run())
    assert health.status_code == 503
    assert non_streaming.status_code == 500 and "exited unexpectedly" in non_streaming.json()["error"]["message"]
    events = parse_sse(body.encode())
    assert events[-1]["error"]["type"] == "server_error" and "exited unexpectedly" in events[-1]["error"]["message"]
    assert server.wait_exit(timeout=30) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(other, 0)  # the surviving child was stopped too
