"""Send one streaming OpenAI-style request and time it; never raises for a failed request.

Timing follows vLLM's benchmark: start just before the request goes out, TTFT at the first
event whose content is non-empty (delta.content for chat, choices[].text for completions; a role
chunk or an empty chunk does not count), one timestamp per content event for ITL, E2E at the
end of the stream. Output tokens come from the usage chunk (requested with
stream_options.include_usage); without one they are counted as content chunks, with a warning.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

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
            "model": self.model,
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


async def send_request(http: httpx.AsyncClient, endpoint: Endpoint, spec: RequestSpec) -> RequestResult:
    """Stream one request. Errors of any kind come back as a failed RequestResult."""
    result = RequestResult(input_len=spec.input_len, start_time=time.perf_counter())
    try:
        # The whole request, not just each read, has to finish within timeout_s.
        async with asyncio.timeout(endpoint.timeout_s):
            await _stream(http, endpoint, spec, result)
    except TimeoutError:
        return result.fail("timeout", f"no complete answer within {endpoint.timeout_s} s")
    except httpx.TimeoutException as exc:
        return result.fail("timeout", f"{type(exc).__name__}: {exc}")
    except httpx.HTTPError as exc:
        # ConnectError, ReadError, RemoteProtocolError (server closed mid-stream), ...
        return result.fail(type(exc).__name__, str(exc))
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


async def _stream(http: httpx.AsyncClient, endpoint: Endpoint, spec: RequestSpec, result: RequestResult) -> None:
    async with http.stream("POST", endpoint.url, json=endpoint.payload(spec), headers=endpoint.headers()) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode("utf-8", "replace")
            result.fail(f"http_{response.status_code}", body)
            return
        parser = SSEParser()
        usage: dict[str, Any] | None = None
        text_parts: list[str] = []
        done = False
        stream = response.aiter_text()
        async for text in stream:
            now = time.perf_counter()  # every event completed by this read arrived now
            for event in parser.feed(text):
                done, usage = _handle(event.data, endpoint.kind, now, result, text_parts, usage)
                if done or result.error_kind:
                    break
            if done or result.error_kind:
                break
        else:
            now = time.perf_counter()
            for event in parser.close():
                done, usage = _handle(event.data, endpoint.kind, now, result, text_parts, usage)
                if done or result.error_kind:
                    break
        result.e2el_s = time.perf_counter() - result.start_time
        if done:
            await _drain(stream)
    result.generated_text = "".join(text_parts)
    if usage is not None and usage.get("completion_tokens") is not None:
        result.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            result.prompt_tokens = int(usage["prompt_tokens"])
    else:
        result.output_tokens = len(result.chunk_times)
        result.usage_missing = True


async def _drain(stream: AsyncIterator[str]) -> None:
    """Read what follows [DONE] (normally just the end of the body), so httpx can put the
    connection back in its pool; a new connection per request would add a connect to each TTFT.
    Bounded, because a server that keeps the stream open after [DONE] must not fail the request."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in stream:
                pass
    except (TimeoutError, httpx.HTTPError):
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
