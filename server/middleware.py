"""ASGI middleware that runs before any body is parsed: header limits, API key, request body.

The header limits come first (431, as nginx and Node answer an oversized head); then the key, so
a client without it learns nothing about request validation; it is compared in constant time.
/health and /metrics stay open for probes and Prometheus, as in vLLM. A body larger than
MAX_REQUEST_BYTES is refused with 413 while it is read, so a huge upload never sits in memory,
and a client that stops sending its body for `read_timeout_s` gets 408 (nginx's
client_body_timeout): the handler never waits on it for ever, and nothing reached the engine.
A head still arriving is bounded by `server.http_protocol`.
"""
from __future__ import annotations

import asyncio
import hmac

import msgspec
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.anthropic_messages.errors import anthropic_error_body
from server.errors import error_body

MAX_REQUEST_BYTES = 32 << 20
# The request head (request line and headers): nginx's total (4 x 8 KiB buffers) and Apache's
# field count. A normal client sends well under 2 KiB in about 15 fields.
MAX_HEADER_BYTES = 32 << 10
MAX_HEADER_COUNT = 100
BODY_READ_TIMEOUT_S = 30.0
CLOSE = {"connection": "close"}  # after a body cut short: the rest of it must not be read as a request
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
ANTHROPIC_PREFIX = "/v1/messages"


async def _send_error(send: Send, status: int, message: str, extra_headers: list | None = None) -> None:
    await _send_json(send, status, error_body(status, message), extra_headers)


async def _send_json(send: Send, status: int, payload: dict, extra_headers: list | None = None) -> None:
    body = msgspec.json.encode(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """The key as `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>`
    (Anthropic's); a refusal on /v1/messages takes Anthropic's error body."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.expected_x = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            headers = scope["headers"]
            given = next((v for k, v in headers if k == b"authorization"), b"")
            given_x = next((v for k, v in headers if k == b"x-api-key"), b"")
            # both compared, so the time taken says nothing about which header was close
            bearer_ok = hmac.compare_digest(given, self.expected)
            x_ok = hmac.compare_digest(given_x, self.expected_x)
            if not (bearer_ok or x_ok):
                message = "invalid or missing API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                if scope["path"].startswith(ANTHROPIC_PREFIX):
                    await _send_json(send, 401, anthropic_error_body(401, message))
                else:
                    await _send_error(send, 401, message, [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class HeaderLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_HEADER_BYTES, max_count: int = MAX_HEADER_COUNT):
        self.app = app
        self.max_bytes = max_bytes
        self.max_count = max_count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if len(headers) > self.max_count:
                await _send_error(send, 431, f"request has {len(headers)} header fields; at most "
                                             f"{self.max_count} are allowed")
                return
            # As on the wire: "name: value\r\n" per field, and the request line.
            size = sum(len(k) + len(v) + 4 for k, v in headers) + len(scope.get("raw_path", b"")) \
                + len(scope.get("query_string", b"")) + len(scope["method"]) + 12
            if size > self.max_bytes:
                await _send_error(send, 431, f"request header section of about {size} bytes; at most "
                                             f"{self.max_bytes} are allowed")
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_REQUEST_BYTES, read_timeout_s: float = BODY_READ_TIMEOUT_S):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(send, 413, f"request body larger than {self.max_bytes} bytes")
            return
        received = 0
        body_complete = False

        async def limited_receive() -> Message:
            nonlocal received, body_complete
            if body_complete:  # from now on receive() only waits for the disconnect: no timeout
                return await receive()
            try:
                async with asyncio.timeout(self.read_timeout_s):
                    message = await receive()
            except TimeoutError:
                # Raised inside the body read, like the 413 below: FastAPI passes HTTPException
                # through to the error handlers, which answer with the OpenAI error body.
                raise HTTPException(408, f"the request body stopped arriving for {self.read_timeout_s:g} s",
                                    headers=CLOSE) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, f"request body larger than {self.max_bytes} bytes", headers=CLOSE)
                body_complete = not message.get("more_body", False)
            else:
                body_complete = True  # http.disconnect
            return message

        await self.app(scope, limited_receive, send)
