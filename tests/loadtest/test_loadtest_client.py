"""The SSE parser, and the streaming client against a real local server with known delays.

The server is loadtest.fake_server (Starlette + sse-starlette under uvicorn, in a thread, on a
free 127.0.0.1 port). Timing checks have a tight lower bound (the server sleeps at least that
long) and a loose upper bound, because these machines are shared and scheduling adds delay.
"""

import asyncio
import socket
import warnings

import pytest

from loadtest.client import Endpoint, UsageMissingWarning, new_session, send_request
from loadtest.fake_server import FakeServerConfig, start_in_thread
from loadtest.request import RequestSpec
from loadtest.sse import SSEParser

TTFT_S = 0.15
ITL_S = 0.04
SLACK_S = 0.003  # clock granularity: a sleep may end a hair before the requested time
LATE_S = 0.1  # scheduling delay allowed on a loaded machine


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
def test_timings_match_server_delays(servers, kind):
    r = run(servers["timed"].base_url, max_tokens=6, kind=kind)
    assert r.success, r.error_message
    # The chat role chunk comes at once with empty content: TTFT must wait for real content.
    assert TTFT_S - SLACK_S <= r.ttft_s <= TTFT_S + LATE_S
    assert len(r.itls_s) == 5
    assert all(ITL_S - SLACK_S <= gap <= ITL_S + LATE_S for gap in r.itls_s), r.itls_s
    assert sum(r.itls_s) / 5 == pytest.approx(ITL_S, abs=0.02)
    expected_e2e = TTFT_S + 5 * ITL_S
    assert expected_e2e - SLACK_S <= r.e2el_s <= expected_e2e + 2 * LATE_S
    assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 5)
    # Usage chunk read: the fake server counts prompt words.
    assert (r.output_tokens, r.prompt_tokens, r.usage_missing) == (6, 3, False)
    assert r.generated_text == "tok " * 6


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
