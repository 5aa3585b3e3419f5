"""Local queues between the three processes (the child processes' life is `common.child_process`).

ZMQ PUSH/PULL over `ipc://` sockets in a private directory (mkdtemp makes it 0700, so only this
user can connect), msgpack via msgspec with tagged unions, never pickle. Queues are one-way:

    server ──to_worker──▶ tokenizer worker ──to_engine──▶ engine
    server ◀──to_server── tokenizer worker ◀─from_engine── engine

The reading end binds, the writing end connects; ZMQ queues messages until the peer is up, so
start-up order does not matter. High-water marks are off: a PUSH never blocks or drops, and the
volume is bounded by the number of requests in flight.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import zmq


@dataclass(frozen=True)
class IpcPaths:
    directory: str

    @classmethod
    def create(cls) -> IpcPaths:
        return cls(tempfile.mkdtemp(prefix="llm-serve-"))  # mode 0700

    def address(self, name: str) -> str:
        return f"ipc://{os.path.join(self.directory, name)}"

    @property
    def to_worker(self) -> str:
        return self.address("to_worker")

    @property
    def to_server(self) -> str:
        return self.address("to_server")

    @property
    def to_engine(self) -> str:
        return self.address("to_engine")

    @property
    def from_engine(self) -> str:
        return self.address("from_engine")

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def open_socket(ctx: zmq.Context, kind: int, address: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, 0)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


class Channel:
    """A PUSH socket plus the encoder for it."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()

    def send(self, message: msgspec.Struct) -> None:
        self.sock.send(self._encoder.encode(message), copy=False)

    def close(self, linger_ms: int = 0) -> None:
        self.sock.close(linger=linger_ms)


def drain(sock: zmq.Socket) -> Iterator[memoryview]:
    """The messages already waiting on a PULL socket, without blocking; ends when none is left."""
    while True:
        try:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        yield frame.buffer
