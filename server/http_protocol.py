"""uvicorn's httptools protocol with a deadline and a size limit on the request head.

httptools (llhttp, in C) rather than h11 (pure Python): a streamed response writes one chunk per
token per request, and on a small machine the HTTP server's CPU time is taken from the engine's
threads. At 32 streams on 2 cores the server process spent 14-24 % less CPU per streamed token
on httptools (benchmarks/results/2026-12-04-zen4-async-httptools-startup.md).

uvicorn times out idle keep-alive connections only after a response: a client that connects
and sends its request line and headers a byte at a time (slow loris) holds its connection for
ever. Here the whole head must arrive within `header_timeout_s` of the connection or of the
first byte of the next request (nginx's client_header_timeout); a slower client gets a 408 and
is disconnected. Such a client never reaches the app, so it never holds engine resources.

httptools buffers an unfinished head without a bound: here a head still unfinished after
MAX_HEADER_BYTES is refused with a 431 (the size nginx accepts), and an unparsable request gets a
400; both carry the OpenAI error body. A head that arrives whole is checked by
`server.middleware.HeaderLimitMiddleware` (its size and its number of fields).
"""
from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import ClassVar

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.errors import error_body
from server.middleware import MAX_HEADER_BYTES

HEADER_TIMEOUT_S = 30.0


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: ClassVar[float] = HEADER_TIMEOUT_S
    max_head_bytes: ClassVar[int] = MAX_HEADER_BYTES

    @classmethod
    def with_header_timeout(cls, seconds: float) -> type[LimitedHttpToolsProtocol]:
        """The protocol class for uvicorn's `http=`; uvicorn builds one instance per connection."""
        return type(cls.__name__, (cls,), {"header_timeout_s": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False  # a request has begun and its head is not complete
        self._reading_head = True  # bytes received now belong to a head (until it completes)
        self._head_bytes = 0
        super().connection_made(transport)
        self._arm_head_timer()  # a new connection must send its head in time too

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self._reply_and_close(431, f"request header section larger than {self.max_head_bytes} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    # parser callbacks
    def on_message_begin(self) -> None:
        self._in_head = True
        if self._head_timer is None:  # the first byte of the next request on a kept-alive connection
            self._arm_head_timer()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = self._reading_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading_head = True
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        self._reply_and_close(400, "invalid HTTP request")

    # the deadline
    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._in_head:  # part of a head arrived: say why the connection ends
            self._reply_and_close(408, f"the request head did not arrive within {self.header_timeout_s:g} s")
        else:  # the timer runs outside a head only from the connection's start: it never sent a byte
            self.transport.close()  # just close it, as nginx does

    def _reply_and_close(self, status: int, message: str) -> None:
        """A whole response written directly, whatever the parser's state."""
        self._cancel_head_timer()
        body = msgspec.json.encode(error_body(status, message))
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()
