"""uvicorn's h11 protocol with a deadline and a size limit on the request head.

uvicorn times out idle keep-alive connections only after a response: a client that connects
and sends its request line and headers a byte at a time (slow loris) holds its connection for
ever. Here the whole head must arrive within `header_timeout_s` of the connection or of the
first byte of the next request (nginx's client_header_timeout); a slower client gets a 408 and
is disconnected. Such a client never reaches the app, so it never holds engine resources.

h11 refuses a head that grows past its buffer limit (`h11_max_incomplete_event_size`, set to
MAX_HEADER_BYTES by `server.cli`) with an error whose hint is 431, which uvicorn answers as a
plain-text 400; here it is a 431, and both carry the OpenAI error body. A head that arrives
whole in one read is not buffered by h11: `server.middleware.HeaderLimitMiddleware` checks it.
"""
from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import ClassVar

import h11
import msgspec
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE  # as uvicorn imports it
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.errors import error_body

HEADER_TIMEOUT_S = 30.0


class LimitedH11Protocol(H11Protocol):
    header_timeout_s: ClassVar[float] = HEADER_TIMEOUT_S

    @classmethod
    def with_header_timeout(cls, seconds: float) -> type[LimitedH11Protocol]:
        """The protocol class for uvicorn's `http=`; uvicorn builds one instance per connection."""
        return type(cls.__name__, (cls,), {"header_timeout_s": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._head_timer is None:  # the first bytes of the next request on a kept-alive connection
                self._arm_head_timer()
        else:
            self._cancel_head_timer()  # the head is complete (or the connection is done)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        limit = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        if len(self.conn.trailing_data[0]) > limit:  # h11's "Receive buffer too long"
            self._reply_and_close(431, f"request header section larger than {limit} bytes")
        else:
            self._reply_and_close(400, "invalid HTTP request")

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a head arrived: say why the connection ends
            self._reply_and_close(408, f"the request head did not arrive within {self.header_timeout_s:g} s")
        else:  # an idle connection that never sent a byte: just close it, as nginx does
            self.transport.close()

    def _reply_and_close(self, status: int, message: str) -> None:
        """A whole response written directly: h11's state may be ERROR here, or idle."""
        self._cancel_head_timer()
        body = msgspec.json.encode(error_body(status, message))
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()
