"""The SSE parser, and the streaming client against a real local server with known delays.

The server is loadtest.fake_server (Starlette + sse-starlette under uvicorn, in a thread, on a
free 127.0.0.1 port). Against it the timing checks are lower bounds only (the server sleeps at
least that long, so no load on the machine can break them) and the relations between the figures;
how the client turns arrival times into TTFT, ITL and E2E is checked exactly with the times given
(`_handle` takes each read's time as an argument). How close the measured figures come to the
server's delays on a given machine is what `python -m loadtest` against `python -m
loadtest.fake_server --ttft-ms 150 --itl-ms 40` prints.
"""

import asyncio
import json
import socket
import warnings

import pytest

from loadtest.client import Endpoint, UsageMissingWarning, _handle, new_session, send_request
from loadtest.fake_server import FakeServerConfig, start_in_thread
from loadtest.request import RequestResult, RequestSpec
from loadtest.sse import SSEParser

TTFT_S = 0.15
ITL_S = 0.04
SLACK_S = 0.003  # clock granularity: a sleep may end a hair before the requested time


def test_sse_parser_framing():
    parser = SSEParser()
    # "\r\n" endings, a "\r\n" split over two reads, a comment (ping), a field without a space.
    assert parser.feed(': ping\r\ndata: {"a": 1}\r') == []
    assert [e.data for e in parser.feed("\n\r\ndata:2\n")] == ['{"a": 1}']
    assert [e.data for e in parser.feed("\ndata: x\ndata: y\n\n")] == ["2", "x\ny"]
    # A lone "\r" ends a line too; the last event may lack its blank line at EOF.
    assert [e.data for e in parser.feed("event: error\rdata: z\r\r")] == ["z"]
    assert parser.feed("data: [DONE]") == []
    assert [e.data for e in parser.close()] == ["[DONE]"]


def test_sse_parser_event_field():
    parser = SSEParser()
    events = parser.feed("event: error\ndata: {}\n\ndata: ok\n\n")
    assert [(e.event, e.data) for e in events] == [("error", "{}"), ("message", "ok")]


@pytest.fixture(scope="module")
def servers():
    configs = {
        "timed": FakeServerConfig(ttft_s=TTFT_S, itl_s=ITL_S),
        "multi": FakeServerConfig(ttft_s=0.01, itl_s=0.01, tokens_per_chunk=3, sep="\r\n"),
        "no_usage": FakeServerConfig(ttft_s=0.01, itl_s=0.005, send_usage=False),
        "failing": FakeServerConfig(fail_every=1, fail_status=503),
        "keyed": FakeServerConfig(ttft_s=0.01, itl_s=0.001, api_key="sekrit"),
        "stream_error": FakeServerConfig(ttft_s=0.01, itl_s=0.001, stream_error_after=2),
        "slow": FakeServerConfig(ttft_s=5.0),
    }
    running = {name: start_in_thread(config) for name, config in configs.items()}
    yield running
    for server in running.values():
        server.stop()


def run(base_url, max_tokens=6, kind="chat", prompt="one two three", repeat=1, **endpoint_kwargs):
    """Send the same request `repeat` times in a row over one client; returns the last result."""
    endpoint = Endpoint(base_url=base_url, model="fake-model", kind=kind, **endpoint_kwargs)
    spec = RequestSpec(prompt=prompt, messages=None, max_tokens=max_tokens, input_len=3)

    async def go():
        async with new_session(endpoint.timeout_s) as http:
            for _ in range(repeat):
                result = await send_request(http, endpoint, spec)
            return result

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_timings_follow_the_server_delays(servers, kind):
    r = run(servers["timed"].base_url, max_tokens=6, kind=kind)
    assert r.success, r.error_message
    # The chat role chunk comes at once with empty content: TTFT must wait for real content.
    assert r.ttft_s >= TTFT_S - SLACK_S
    assert len(r.itls_s) == 5 and all(gap >= 0 for gap in r.itls_s)
    assert r.e2el_s >= TTFT_S + 5 * ITL_S - SLACK_S  # the server slept that long before its last token
    assert r.ttft_s + sum(r.itls_s) <= r.e2el_s  # the last content came before the end of the stream
    assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 5)
    # Usage chunk read: the fake server counts prompt words.
    assert (r.output_tokens, r.prompt_tokens, r.usage_missing) == (6, 3, False)
    assert r.generated_text == "tok " * 6


def test_ttft_and_itls_from_the_read_times():
    """Each event is stamped with the time of the read that completed it: the role chunk does not
    start TTFT, and events that arrive in one read share its time (an ITL of 0)."""
    result = RequestResult(input_len=3, start_time=10.0)
    usage = None
    text: list[str] = []

    def event(chunk: dict | str, now: float) -> bool:
        nonlocal usage
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        done, usage = _handle(data, "chat", now, result, text, usage)
        return done

    def delta(content: str) -> dict:
        return {"choices": [{"index": 0, "delta": {"content": content}}]}

    event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, 10.01)
    event(delta("a"), 10.25)
    event(delta("b"), 10.30)
    event(delta("c"), 10.42)
    event(delta("d"), 10.42)  # the same read as "c"
    event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}, 10.5)
    assert event("[DONE]", 10.5) is True
    assert result.ttft_s == pytest.approx(0.25)
    assert result.itls_s == pytest.approx([0.05, 0.12, 0.0])
    assert "".join(text) == "abcd" and usage == {"prompt_tokens": 3, "completion_tokens": 4}


def test_several_tokens_per_chunk_and_crlf(servers):
    r = run(servers["multi"].base_url, max_tokens=7, repeat=3)  # chunks of 3, 3, 1 tokens, "\r\n" framing
    assert r.success, r.error_message
    assert len(r.chunk_times) == 3
    assert r.output_tokens == 7  # from usage, not the chunk count
    # The stream is read to its end, so back-to-back requests share one connection.
    assert len(servers["multi"].app.state.client_ports) == 1


def test_missing_usage_falls_back_with_warning(servers):
    with pytest.warns(UsageMissingWarning, match="no usage chunk"):
        r = run(servers["no_usage"].base_url, max_tokens=4)
    assert r.success
    assert (r.output_tokens, r.prompt_tokens, r.usage_missing) == (4, None, True)


def test_http_errors_are_counted_not_raised(servers):
    r = run(servers["failing"].base_url)
    assert (r.success, r.error_kind) == (False, "http_503")
    assert "injected failure" in r.error_message
    assert r.ttft_s is None
    r = run(servers["keyed"].base_url, api_key="wrong")
    assert (r.success, r.error_kind) == (False, "http_401")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good run with usage must not warn
        r = run(servers["keyed"].base_url, api_key="sekrit")
    assert r.success


def test_stream_error_timeout_and_refused_connection(servers):
    r = run(servers["stream_error"].base_url)
    assert (r.success, r.error_kind, r.error_message) == (False, "stream_error", "injected stream error")
    r = run(servers["slow"].base_url, timeout_s=0.3)
    assert (r.success, r.error_kind) == (False, "timeout")
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = run(f"http://127.0.0.1:{port}/v1")
    assert (r.success, r.error_kind) == (False, "ConnectError")
