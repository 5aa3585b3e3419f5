"""Send one streaming OpenAI-style request and time it; never raises for a failed request.

Timing follows vLLM's benchmark: start just before the request goes out, TTFT at the first
event whose content is non-empty (delta.content for chat, choices[].text for completions; a role
chunk or an empty chunk does not count), one timestamp per content event for ITL, E2E at the
end of the stream. Output tokens come from the usage chunk (requested with
stream_options.include_usage); without one they are counted as content chunks, with a warning.

The transport is aiohttp, as in vLLM's benchmark client: on a machine it shares with the server it
measures, every chunk this process reads is CPU taken from that server, and aiohttp's C parser
reads a streamed chunk for about 25 us of CPU where httpx (pure-Python h11 under anyio) took about
65 (README, "Its own footprint"). Failures keep the kinds the reports have always used
(`ConnectError`, `RemoteProtocolError`, `ReadError`, `timeout`).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
import warnings
from dataclasses import dataclass
from typing import Any

import aiohttp

from loadtest.request import RequestResult, RequestSpec
from loadtest.sse import SSEParser

DRAIN_TIMEOUT_S = 2.0


class UsageMissingWarning(UserWarning):
    """The server streamed no usage chunk, so output tokens were counted from content chunks."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send: one per target, shared by all its requests."""

    base_url: str  # ends in /v1, no trailing slash
    model: str
    kind: str  # "chat" or "completions"
    api_key: str | None = None
    temperature: float = 0.0
    top_p: float | None = None
    ignore_eos: bool = False
    timeout_s: float = 600.0

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions" if self.kind == "chat" else f"{self.base_url}/completions"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def payload(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": spec.model or self.model,
            "max_tokens": spec.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.kind == "chat":
            body["messages"] = list(spec.messages) if spec.messages else [{"role": "user", "content": spec.prompt}]
        else:
            assert spec.prompt is not None, "the completions endpoint takes a prompt, not messages"
            body["prompt"] = spec.prompt
        # Sent only when asked for: a strict server rejects fields it does not know.
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.top_p is not None:
            body["top_p"] = self.top_p
        return body


def _content(kind: str, chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if kind == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def new_session(timeout_s: float) -> aiohttp.ClientSession:
    """The one HTTP session of a load test: no cap on connections (a request queued behind a pool
    limit would count that wait as TTFT), idle ones kept between rounds so the next round starts
    warm, `timeout_s` for a connect or any one read, no proxies from the environment."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=max(timeout_s, 60.0))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)


def _failure_kind(exc: aiohttp.ClientError) -> str:
    """The report's name for a transport failure (the names httpx gave them)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return "RemoteProtocolError"  # the server closed the connection or cut the body short
    if isinstance(exc, aiohttp.ClientOSError):
        return "ReadError"
    return type(exc).__name__


async def send_request(http: aiohttp.ClientSession, endpoint: Endpoint, spec: RequestSpec) -> RequestResult:
    """Stream one request. Errors of any kind come back as a failed RequestResult."""
    result = RequestResult(input_len=spec.input_len, start_time=time.perf_counter())
    try:
        # The whole request, not just each read, has to finish within timeout_s.
        async with asyncio.timeout(endpoint.timeout_s):
            await _stream(http, endpoint, spec, result)
    except TimeoutError as exc:  # the whole request's limit, or one read's (aiohttp's ServerTimeoutError)
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else f"no complete answer within {endpoint.timeout_s} s"
        return result.fail("timeout", detail)
    except aiohttp.ClientError as exc:
        return result.fail(_failure_kind(exc), str(exc))
    except Exception as exc:  # a reply this client cannot make sense of, e.g. usage counts that are not numbers
        return result.fail(f"client_{type(exc).__name__}", str(exc))
    if result.error_kind:
        return result
    if not result.chunk_times:
        return result.fail("no_content", "the stream ended without any content")
    if result.usage_missing:
        warnings.warn(
            f"{endpoint.base_url} sent no usage chunk; output tokens are counted as content "
            "chunks, which undercounts when a chunk carries several tokens",
            UsageMissingWarning,
            stacklevel=2,
        )
    result.success = True
    return result


async def _stream(http: aiohttp.ClientSession, endpoint: Endpoint, spec: RequestSpec, result: RequestResult) -> None:
    async with http.post(endpoint.url, json=endpoint.payload(spec), headers=endpoint.headers()) as response:
        if response.status != 200:
            body = (await response.read()).decode("utf-8", "replace")
            result.fail(f"http_{response.status}", body)
            return
        parser = SSEParser()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span two reads
        usage: dict[str, Any] | None = None
        text_parts: list[str] = []
        done = False
        async for data in response.content.iter_any():
            now = time.perf_counter()  # every event completed by this read arrived now
            for event in parser.feed(decoder.decode(data)):
                done, usage = _handle(event.data, endpoint.kind, now, result, text_parts, usage)
                if done or result.error_kind:
                    break
            if done or result.error_kind:
                break
        else:
            now = time.perf_counter()
            for event in parser.feed(decoder.decode(b"", final=True)) + parser.close():
                done, usage = _handle(event.data, endpoint.kind, now, result, text_parts, usage)
                if done or result.error_kind:
                    break
        result.e2el_s = time.perf_counter() - result.start_time
        if done:
            await _drain(response)
    result.generated_text = "".join(text_parts)
    if usage is not None and usage.get("completion_tokens") is not None:
        result.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            result.prompt_tokens = int(usage["prompt_tokens"])
    else:
        result.output_tokens = len(result.chunk_times)
        result.usage_missing = True


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read what follows [DONE] (normally just the end of the body), so the connection goes back
    to the pool; a response left unread is closed, and a new connection per request would add a
    connect to each TTFT. Bounded, because a server that keeps the stream open after [DONE] must
    not fail the request."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            await response.content.read()
    except (TimeoutError, aiohttp.ClientError):
        pass


def _handle(
    data: str,
    kind: str,
    now: float,
    result: RequestResult,
    text_parts: list[str],
    usage: dict[str, Any] | None,
) -> tuple[bool, dict[str, Any] | None]:
    """Apply one event's data to result; returns (stream is done, latest usage)."""
    if data.strip() == "[DONE]":
        return True, usage
    try:
        chunk = json.loads(data)
    except ValueError:
        result.fail("bad_chunk", data)
        return False, usage
    if not isinstance(chunk, dict):
        result.fail("bad_chunk", data)
        return False, usage
    if chunk.get("error") is not None:
        # In-stream error (OpenAI's and vLLM's shape): {"error": {"message": ..., "code": ...}}
        error = chunk["error"]
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        result.fail("stream_error", message)
        return False, usage
    content = _content(kind, chunk)
    if content:
        if result.ttft_s is None:
            result.ttft_s = now - result.start_time
        result.chunk_times.append(now)
        text_parts.append(content)
    if chunk.get("usage"):
        usage = chunk["usage"]
    return False, usage
