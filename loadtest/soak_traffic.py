"""The soak's requests: streamed, non-streamed and aborted, on both endpoints, and what became
of each one.

Every request sent ends in one of three outcomes:
- ok: the answer is complete (a stream with its finish chunk, usage and [DONE]; a JSON body
  with choices and usage; for an abort, the first text arrived before the client left);
- error: the server answered with an error (an HTTP error status, or an error event in a
  stream): a response all the same, the client knows what happened;
- lost: no answer at all: a timeout, a connection dropped or refused, a stream cut before
  [DONE]. A soak must have none.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.prompts import WORDS
from loadtest.sse import SSEParser

KINDS = ("stream", "nonstream", "abort")


@dataclass(frozen=True)
class SoakRequest:
    kind: str  # one of KINDS
    endpoint: str  # "chat" or "completions"
    body: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    kind: str
    result: str  # "ok", "error" or "lost"
    detail: str = ""  # the error kind or why it is lost


def make_request(rng: random.Random, mix: dict[str, float], model: str, input_len: int, output_len: int,
                 ignore_eos: bool) -> SoakRequest:
    """A random request of the mix: prompt of 1..input_len words, max_tokens 1..output_len
    (an abort asks for output_len, so it is still running when the client leaves)."""
    kind = rng.choices(list(mix), weights=list(mix.values()))[0]
    endpoint = rng.choice(("chat", "completions"))
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, input_len)))
    body: dict[str, Any] = {"model": model, "temperature": rng.choice((0.0, 0.7)),
                            "max_tokens": output_len if kind == "abort" else rng.randint(1, output_len)}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if kind != "nonstream":
        body.update(stream=True, stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True
    return SoakRequest(kind, endpoint, body)


async def send(http: httpx.AsyncClient, base_url: str, request: SoakRequest, timeout_s: float) -> Outcome:
    url = f"{base_url}/chat/completions" if request.endpoint == "chat" else f"{base_url}/completions"
    try:
        async with asyncio.timeout(timeout_s):
            if request.kind == "nonstream":
                return await _non_streaming(http, url, request)
            return await _streaming(http, url, request)
    except TimeoutError:
        return Outcome(request.kind, "lost", f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return Outcome(request.kind, "lost", f"{type(exc).__name__}: {exc}"[:300])


async def _non_streaming(http: httpx.AsyncClient, url: str, request: SoakRequest) -> Outcome:
    response = await http.post(url, json=request.body)
    if response.status_code != 200:
        return Outcome(request.kind, "error", f"http_{response.status_code}")
    try:
        doc = response.json()
        complete = bool(doc["choices"]) and doc["usage"]["completion_tokens"] >= 0
    except (ValueError, KeyError, TypeError):
        complete = False
    return Outcome(request.kind, "ok") if complete else Outcome(request.kind, "lost", "incomplete JSON body")


async def _streaming(http: httpx.AsyncClient, url: str, request: SoakRequest) -> Outcome:
    async with http.stream("POST", url, json=request.body) as response:
        if response.status_code != 200:
            await response.aread()
            return Outcome(request.kind, "error", f"http_{response.status_code}")
        parser = SSEParser()
        finished = usage = False
        async for text in response.aiter_text():
            for event in parser.feed(text):
                if event.data == "[DONE]":
                    if finished and usage:
                        return Outcome(request.kind, "ok")
                    return Outcome(request.kind, "lost", "[DONE] before the finish chunk and usage")
                try:
                    chunk = json.loads(event.data)
                except ValueError:
                    chunk = None
                if not isinstance(chunk, dict):
                    return Outcome(request.kind, "lost", f"an event that is no JSON object: {event.data[:100]!r}")
                if chunk.get("error"):
                    return Outcome(request.kind, "error", f"stream_error {chunk['error'].get('code')}")
                choices = chunk.get("choices") or []
                if request.kind == "abort" and any(_text(c) for c in choices):
                    return Outcome(request.kind, "ok")  # leaving the block closes the connection
                finished = finished or any(c.get("finish_reason") for c in choices)
                usage = usage or bool(chunk.get("usage"))
        return Outcome(request.kind, "lost", "the stream ended without [DONE]")


def _text(choice: dict[str, Any]) -> str:
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""
