"""A child process that crashes tells its parent why on its outbox, then exits with status 1."""
from __future__ import annotations

import multiprocessing

import msgspec
import zmq

from common.child_process import run_child
from common.ipc import IpcPaths, drain, open_socket
from common.messages import FromEngine, ProcessError


def _crashing_child(outbox_address: str) -> None:
    def body(_ctx, _outbox):
        raise RuntimeError("boom in start-up")

    run_child("crasher", "info", outbox_address, body)


def test_a_crash_is_reported_then_the_child_exits_with_status_1():
    paths = IpcPaths.create()
    ctx = zmq.Context()
    try:
        inbox = open_socket(ctx, zmq.PULL, paths.from_engine, bind=True)
        proc = multiprocessing.get_context("spawn").Process(target=_crashing_child, args=(paths.from_engine,))
        proc.start()
        proc.join(timeout=60)
        assert proc.exitcode == 1
        assert inbox.poll(5000)
        decoder = msgspec.msgpack.Decoder(FromEngine)
        (report,) = [decoder.decode(frame) for frame in drain(inbox)]
        assert report == ProcessError("crasher", "RuntimeError: boom in start-up")
    finally:
        ctx.destroy(linger=0)
        paths.remove()
