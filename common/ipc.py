"""Local queues between the three processes, and what every child process does the same way.

ZMQ PUSH/PULL over `ipc://` sockets in a private directory (mkdtemp makes it 0700, so only this
user can connect), msgpack via msgspec with tagged unions, never pickle. Queues are one-way:

    server ──to_worker──▶ tokenizer worker ──to_engine──▶ engine
    server ◀──to_server── tokenizer worker ◀─from_engine── engine

The reading end binds, the writing end connects; ZMQ queues messages until the peer is up, so
start-up order does not matter. High-water marks are off: a PUSH never blocks or drops, and the
volume is bounded by the number of requests in flight.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass

import msgspec
import zmq

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"


@dataclass(frozen=True)
class IpcPaths:
    directory: str

    @classmethod
    def create(cls) -> "IpcPaths":
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


# ---- every child process -------------------------------------------------------------------


def start_child_process(name: str, log_level: str) -> None:
    """Name the process (logs and `ps`), set up logging, and tie its life to the parent's.

    SIGINT and SIGTERM are ignored: Ctrl+C reaches the whole process group, and a service
    manager may signal every process of the service; the server drains and then stops its
    children itself. If the server dies without doing so, the child is killed (Linux) or
    notices that its parent changed (`ParentWatch`).
    """
    multiprocessing.current_process().name = name
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME: the name `ps -o comm` shows
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            logger.debug("prctl unavailable; relying on the parent watch")


class ParentWatch:
    """Exits the child when the process that started it is gone."""

    def __init__(self):
        self._parent_pid = os.getppid()

    def check(self) -> None:
        if os.getppid() != self._parent_pid:
            logger.error("the server process is gone; exiting")
            os._exit(1)


def report_crash(channel: Channel | None, process: str, error: BaseException) -> None:
    """Log the traceback and try to tell the server before the process exits with status 1."""
    from common.messages import ProcessError

    logger.critical("%s process crashed", process, exc_info=error)
    if channel is not None:
        try:
            channel.send(ProcessError(process=process, message=f"{type(error).__name__}: {error}"))
            channel.close(linger_ms=1000)  # let the report leave before we exit
        except zmq.ZMQError:
            pass
