"""What every child process (engine, tokenizer worker) does the same way: its name, logging and
signals, a watch on its parent, and a crash report to the server before a loud exit.

Both entry functions are `run_child(...)` around their own body, so a crash anywhere in a child,
start-up included, reaches the server as a ProcessError on the child's outbox and the process
exits with status 1; the server then fails every request in flight and stops, never hangs.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable

import zmq

from common.ipc import Channel, open_socket
from common.messages import ProcessError

logger = logging.getLogger(__name__)

# The same log line in every process, the server's too; processName tells them apart.
LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"
IDLE_POLL_MS = 1000  # how long an idle child waits on its sockets before it checks its parent


def run_child(name: str, log_level: str, outbox_address: str,
              body: Callable[[zmq.Context, Channel], None]) -> None:
    """The entry of a child process: name it, connect its outbox (its PUSH socket downstream:
    the engine's goes to the tokenizer worker, the worker's to the server), run
    `body(ctx, outbox)`; on any exception report the crash there and exit 1."""
    start_child_process(name, log_level)
    ctx = zmq.Context()
    outbox = Channel(open_socket(ctx, zmq.PUSH, outbox_address, bind=False))
    try:
        body(ctx, outbox)
    except BaseException as exc:  # noqa: BLE001 - any crash is reported, then the process exits loudly
        report_crash(outbox, name, exc)
        raise SystemExit(1) from None


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


def report_crash(channel: Channel, process: str, error: BaseException) -> None:
    """Log the traceback and try to tell the server before the process exits with status 1."""
    logger.critical("%s process crashed", process, exc_info=error)
    try:
        channel.send(ProcessError(process=process, message=f"{type(error).__name__}: {error}"))
        channel.close(linger_ms=1000)  # let the report leave before we exit
    except zmq.ZMQError:
        pass
