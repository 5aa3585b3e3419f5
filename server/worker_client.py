"""The server's end of the queues to the tokenizer worker: requests go out, text comes back.

One reader task receives everything the worker sends and routes it: TextDeltas to the
RequestStream of their request (each HTTP handler reads its own) and to that request's latency
metrics, tokenize answers to their futures, engine gauges to the metrics. Messages for requests
that are gone (the client left) are dropped. Sending never blocks: PUSH with no high-water mark.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable

import msgspec
import zmq
import zmq.asyncio

from common.ipc import Channel, IpcPaths, open_socket
from common.messages import (AbortRequest, DetokenizeResponse, EngineReady, GenerateRequest, ProcessError,
                             PromptAccepted, RequestRejected, TextDelta, TextOutputs, TokenizeResponse, ToServer)
from server.errors import ApiError, unavailable
from server.metrics import RequestMetrics, ServerMetrics

logger = logging.getLogger(__name__)


class Failure:
    """Put in a stream's queue when the request ends without its output: the pipeline died under
    it, or the server aborted it at the end of a drain."""

    def __init__(self, error: ApiError):
        self.error = error

    @classmethod
    def engine_failed(cls, reason: str) -> Failure:
        return cls(ApiError(500, f"the request failed: {reason}", code="engine_failed"))


class RequestStream:
    """The TextDeltas of one request, in order; iteration ends after the one carrying usage."""

    def __init__(self, request_id: str, num_choices: int, metrics: RequestMetrics):
        self.request_id = request_id
        self.num_unfinished = num_choices
        self.num_prompt_tokens = 0  # known once the worker accepted the request
        self.metrics = metrics
        self.queue: asyncio.Queue[TextDelta | PromptAccepted | RequestRejected | Failure] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[TextDelta]:
        while True:
            item = await self.queue.get()
            if isinstance(item, Failure):
                raise item.error
            yield item
            if item.usage is not None:
                return


class WorkerClient:
    def __init__(self, paths: IpcPaths, metrics: ServerMetrics, max_in_flight_seqs: int):
        self.paths = paths
        self.metrics = metrics
        self.max_in_flight_seqs = max_in_flight_seqs
        ctx = zmq.Context()
        self._ctx = ctx
        self._pull = open_socket(zmq.asyncio.Context.shadow(ctx.underlying), zmq.PULL, paths.to_server, bind=True)
        self._push = Channel(open_socket(ctx, zmq.PUSH, paths.to_worker, bind=True))
        self.streams: dict[str, RequestStream] = {}
        self._pending: dict[str, asyncio.Future] = {}  # tokenize / detokenize answers
        self._ids = itertools.count()
        self.ready: EngineReady | None = None
        self.failure: str | None = None
        self.on_ready: Callable[[EngineReady], None] = lambda ready: None
        self.on_failure: Callable[[str], None] = lambda reason: None
        self._reader: asyncio.Task | None = None

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(), name="worker-client-reader")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self._pull.close(linger=0)
        self._push.close()
        self._ctx.term()

    @property
    def num_in_flight_seqs(self) -> int:
        """Choices admitted and not finished (a sum over at most max_in_flight_seqs streams)."""
        return sum(stream.num_unfinished for stream in self.streams.values())

    # ---- requests -------------------------------------------------------------------------

    def check_capacity(self, num_choices: int) -> None:
        if num_choices > self.max_in_flight_seqs:  # could never be admitted: not worth a retry
            raise ApiError(400, f"n: {num_choices} choices are more than this server holds at once "
                                f"({self.max_in_flight_seqs})", "n")
        in_flight = self.num_in_flight_seqs
        if in_flight + num_choices > self.max_in_flight_seqs:
            raise unavailable(f"too many requests waiting ({in_flight} sequences in flight); retry later")

    async def generate(self, request: GenerateRequest, num_choices: int) -> RequestStream:
        """Send the request; return its stream once the worker accepted it (ApiError if not)."""
        stream = RequestStream(request.request_id, num_choices, RequestMetrics(self.metrics))
        self.streams[request.request_id] = stream
        try:
            self._push.send(request)  # inside: a request that cannot be sent must not stay in flight
            first = await stream.queue.get()
        except BaseException:
            self.abort(request.request_id)
            raise
        if isinstance(first, RequestRejected):
            if first.status == 503:  # busy, not bad input: the client may retry
                raise unavailable(first.message)
            raise ApiError(first.status, first.message, first.param)
        if isinstance(first, Failure):
            raise first.error
        assert isinstance(first, PromptAccepted), f"unexpected first message {type(first).__name__}"
        stream.metrics.on_accepted(first.num_prompt_tokens)
        stream.num_prompt_tokens = first.num_prompt_tokens
        return stream

    def abort(self, request_id: str) -> None:
        """The client is gone: stop its sequences in the engine now. Finished ids are ignored."""
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return
        stream.metrics.on_aborted(stream.num_unfinished)
        if self.failure is None:
            self._push.send(AbortRequest([request_id]))

    def abort_all(self, error: ApiError) -> int:
        """End every request in flight with `error` (each stream sends it, then [DONE]) and stop
        their sequences in the engine; returns how many there were."""
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream.metrics.on_aborted(stream.num_unfinished)
            stream.queue.put_nowait(Failure(error))
        if streams and self.failure is None:
            self._push.send(AbortRequest([stream.request_id for stream in streams]))
        return len(streams)

    async def call(self, make_request: Callable[[str], msgspec.Struct]) -> TokenizeResponse | DetokenizeResponse:
        """A tokenize / detokenize round trip; ApiError for bad input."""
        if self.failure is not None:
            raise ApiError(500, self.failure, code="engine_failed")
        request_id = f"tok-{next(self._ids)}"
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._push.send(make_request(request_id))
            return await future
        finally:
            self._pending.pop(request_id, None)

    # ---- what the worker sends ------------------------------------------------------------

    async def _read_loop(self) -> None:
        decoder = msgspec.msgpack.Decoder(ToServer)
        try:
            while True:
                frame = await self._pull.recv(copy=False)
                self._dispatch(decoder.decode(frame.buffer))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken pipeline must fail loudly, not hang
            logger.exception("reading from the tokenizer worker failed")
            self.fail(f"internal error: {type(exc).__name__}: {exc}")

    def _dispatch(self, msg) -> None:
        if isinstance(msg, TextOutputs):
            if msg.stats is not None:
                self.metrics.on_engine_stats(msg.stats)
            now = time.perf_counter()
            for delta in msg.deltas:
                self._on_delta(delta, now)
        elif isinstance(msg, PromptAccepted):
            stream = self.streams.get(msg.request_id)
            if stream is not None:
                stream.queue.put_nowait(msg)
        elif isinstance(msg, RequestRejected):  # answers a generation or a tokenize call
            future = self._pending.get(msg.request_id)
            if future is not None:
                if not future.done():
                    future.set_exception(ApiError(msg.status, msg.message, msg.param))
                return
            stream = self.streams.pop(msg.request_id, None)
            if stream is not None:
                stream.queue.put_nowait(msg)
        elif isinstance(msg, (TokenizeResponse, DetokenizeResponse)):
            future = self._pending.get(msg.request_id)
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, EngineReady):
            self.ready = msg
            self.on_ready(msg)
        elif isinstance(msg, ProcessError):
            reason = f"the {msg.process} process failed: {msg.message}"
            if self.failure is None:
                self.fail(reason)
            else:  # its exit was noticed first; the why still belongs in the log
                logger.error("%s", reason)

    def _on_delta(self, delta: TextDelta, now: float) -> None:
        if delta.detokenize_mismatch:  # counted even when the client has left
            self.metrics.detokenize_mismatch.inc()
        stream = self.streams.get(delta.request_id)
        if stream is None:
            return  # the client left; the abort is on its way
        stream.metrics.on_delta(delta, now)
        if delta.finish_reason is not None:
            stream.num_unfinished -= 1
        if delta.usage is not None:
            assert stream.num_unfinished == 0, f"usage before every choice of {delta.request_id} finished"
            del self.streams[delta.request_id]
        stream.queue.put_nowait(delta)

    def fail(self, reason: str) -> None:
        """The pipeline is broken: end every request with an error, then tell the server."""
        if self.failure is not None:
            return
        self.failure = reason
        logger.error("%s", reason)
        for stream in self.streams.values():
            stream.queue.put_nowait(Failure.engine_failed(reason))
        self.streams.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ApiError(500, reason, code="engine_failed"))
        self.on_failure(reason)
