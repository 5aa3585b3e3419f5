"""ASGI middleware that runs before any body is parsed: API key and request size.

The key is checked first, so a client without it learns nothing about request validation; it is
compared in constant time. /health and /metrics stay open for probes and Prometheus, as in vLLM.
A body larger than MAX_REQUEST_BYTES is refused with 413 while it is read, so a huge upload never
sits in memory (header size is bounded by uvicorn's h11 limit, see `server.cli`).
"""
from __future__ import annotations

import hmac

import msgspec
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import error_body

MAX_REQUEST_BYTES = 32 << 20
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


async def _send_error(send: Send, status: int, message: str, extra_headers: list | None = None) -> None:
    body = msgspec.json.encode(error_body(status, message))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                await _send_error(send, 401, "invalid or missing API key; send 'Authorization: Bearer <key>'",
                                  [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_REQUEST_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(send, 413, f"request body larger than {self.max_bytes} bytes")
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the body read; FastAPI passes HTTPException through to the
                    # error handlers, which answer with the OpenAI error body.
                    raise HTTPException(413, f"request body larger than {self.max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)
