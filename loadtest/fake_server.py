"""A scripted OpenAI-style streaming server with known delays, to test the load generator itself.

It generates no text: it answers /v1/chat/completions and /v1/completions with max_tokens
"tok" tokens, sending the role chunk at once, the first content chunk after ttft_s, then one
chunk of tokens_per_chunk tokens every itl_s, then the finish chunk, the usage chunk (when
asked for and send_usage) and [DONE]. Because the delays are known, measured TTFT and ITL can be
checked against them. Faults on request: every fail_every-th request gets HTTP fail_status,
stream_error_after sends an in-stream error chunk instead of the next content chunk.

Tests start it in a thread with start_in_thread(); by hand: `python -m loadtest.fake_server
--port 8001 --ttft-ms 50 --itl-ms 10` and point `python -m loadtest` at http://127.0.0.1:8001/v1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass(frozen=True)
class FakeServerConfig:
    model: str = "fake-model"
    ttft_s: float = 0.05  # role chunk at once, first content chunk after this
    itl_s: float = 0.01  # between content chunks
    tokens_per_chunk: int = 1
    send_usage: bool = True  # honour stream_options.include_usage
    fail_every: int = 0  # 0: never; N: requests N, 2N, ... get fail_status
    fail_status: int = 503
    stream_error_after: int = -1  # -1: never; k: an error chunk replaces content chunk k (0-based)
    sep: str = "\n"  # SSE line ending; sse-starlette's own default is "\r\n"
    api_key: str | None = None


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
    )


def build_app(config: FakeServerConfig) -> Starlette:
    app = Starlette(routes=[])
    # What tests look at: how many requests came, when (time.monotonic()), the last one, connections.
    app.state.requests_seen = 0
    app.state.arrivals = []
    app.state.last_body = None
    app.state.last_authorization = None
    app.state.client_ports = set()  # one per TCP connection: shows whether clients reuse them

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": config.model, "object": "model", "owned_by": "fake"}]})

    async def generate(request: Request) -> Response:
        app.state.requests_seen += 1
        app.state.arrivals.append(time.monotonic())
        app.state.last_authorization = request.headers.get("authorization")
        if request.client is not None:
            app.state.client_ports.add(request.client.port)
        if config.api_key is not None and request.headers.get("authorization") != f"Bearer {config.api_key}":
            return _error(401, "bad api key", "authentication_error")
        if config.fail_every and app.state.requests_seen % config.fail_every == 0:
            return _error(config.fail_status, "injected failure", "server_error")
        body = await request.json()
        app.state.last_body = body
        if body.get("stream") is not True:
            return _error(400, "this fake server only streams", "invalid_request_error")
        chat = request.url.path.endswith("/chat/completions")
        max_tokens = int(body.get("max_tokens") or 16)
        include_usage = config.send_usage and bool((body.get("stream_options") or {}).get("include_usage"))
        if chat:
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        else:
            prompt_tokens = len(str(body.get("prompt", "")).split())
        return EventSourceResponse(_events(config, chat, max_tokens, prompt_tokens, include_usage), sep=config.sep)

    app.router.routes.extend(
        [
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
        ]
    )
    return app


async def _events(
    config: FakeServerConfig, chat: bool, max_tokens: int, prompt_tokens: int, include_usage: bool
) -> AsyncIterator[dict[str, str]]:
    base = {
        "id": "cmpl-fake",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": config.model,
    }

    def chunk(text: str, finish: str | None = None, role: bool = False) -> dict[str, str]:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        return {"data": json.dumps({**base, "choices": [choice]})}

    if chat:
        yield chunk("", role=True)  # carries no content, so it must not end TTFT
    await asyncio.sleep(config.ttft_s)
    sent = 0
    index = 0
    while sent < max_tokens:
        if index:
            await asyncio.sleep(config.itl_s)
        if index == config.stream_error_after:
            yield {
                "data": json.dumps({"error": {"message": "injected stream error", "type": "server_error", "code": 500}})
            }
            return
        num_tokens = min(config.tokens_per_chunk, max_tokens - sent)
        yield chunk("tok " * num_tokens)
        sent += num_tokens
        index += 1
    yield chunk("", finish="length")
    if include_usage:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": sent, "total_tokens": prompt_tokens + sent}
        yield {"data": json.dumps({**base, "choices": [], "usage": usage})}
    yield {"data": "[DONE]"}


class RunningServer:
    """A fake server serving on 127.0.0.1 in a daemon thread; stop() ends it."""

    def __init__(self, config: FakeServerConfig) -> None:
        self.app = build_app(config)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # a free port, chosen by the OS
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        )
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake server did not start")
            time.sleep(0.01)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests_seen(self) -> int:
        return self.app.state.requests_seen

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def start_in_thread(config: FakeServerConfig | None = None) -> RunningServer:
    return RunningServer(config or FakeServerConfig())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.fake_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--no-usage", action="store_true", help="never send the usage chunk")
    parser.add_argument("--fail-every", type=int, default=0, help="answer every Nth request with HTTP 503")
    args = parser.parse_args()
    config = FakeServerConfig(
        ttft_s=args.ttft_ms / 1000,
        itl_s=args.itl_ms / 1000,
        tokens_per_chunk=args.tokens_per_chunk,
        send_usage=not args.no_usage,
        fail_every=args.fail_every,
    )
    uvicorn.run(build_app(config), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
