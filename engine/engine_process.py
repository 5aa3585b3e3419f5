"""The engine process: owns an LLMEngine and runs its steps, fed by the tokenizer worker.

Between two steps it drains its input queue without blocking (new requests, aborts); it blocks
on the socket only when it has nothing to run. After each step it sends one EngineOutputs with
the step's TokenDeltas and, when they changed, the scheduler/cache gauges. A request the engine
refuses (ValueError from add_request) gets an error delta; it never stops the loop.
"""
from __future__ import annotations

import logging
import time

import msgspec
import zmq

from common.child_process import IDLE_POLL_MS, ParentWatch, run_child
from common.engine_config import EngineConfig
from common.ipc import Channel, IpcPaths, open_socket
from common.messages import (AbortRequest, EngineOutputs, EngineReady, EngineRequest, EngineStats, TokenDelta,
                             ToEngine)

logger = logging.getLogger(__name__)

PROCESS_NAME = "engine"


def run_engine_process(config: EngineConfig, paths: IpcPaths, log_level: str = "info") -> None:
    """Entry function of the engine process (multiprocessing spawn target)."""

    def body(ctx: zmq.Context, outbox: Channel) -> None:
        inbox = open_socket(ctx, zmq.PULL, paths.to_engine, bind=True)
        from engine.llm_engine import LLMEngine  # torch is imported here, in this process only

        engine = LLMEngine(config)
        outbox.send(EngineReady(num_kv_tokens=engine.num_kv_tokens, max_model_len=engine.max_model_len,
                                device=str(engine.device), dtype=str(engine.dtype).removeprefix("torch."),
                                vocab_size=engine.vocab_size, model_dir=str(engine.model_dir)))
        EngineLoop(engine, inbox, outbox).run()

    run_child(PROCESS_NAME, log_level, paths.from_engine, body)



class EngineLoop:
    def __init__(self, engine, inbox: zmq.Socket, outbox: Channel):
        self.engine = engine
        self.inbox = inbox
        self.outbox = outbox
        self.decoder = msgspec.msgpack.Decoder(ToEngine)
        self.poller = zmq.Poller()
        self.poller.register(inbox, zmq.POLLIN)
        self.parent = ParentWatch()
        self.error_deltas: list[TokenDelta] = []
        # request id -> arrival time, until the request is first scheduled (queue-time metric)
        self.queued: dict[str, float] = {}
        self.queue_times: list[float] = []
        self.last_gauges: tuple | None = None
        self.last_parent_check = time.monotonic()

    def run(self) -> None:
        while True:
            self.run_once()
            now = time.monotonic()
            if now - self.last_parent_check > IDLE_POLL_MS / 1000:
                self.last_parent_check = now
                self.parent.check()

    def run_once(self) -> None:
        """Take what arrived (waiting for it only when idle), run one step, send its output."""
        self._drain_inbox(block=not self.engine.has_unfinished())
        deltas = self.engine.step() if self.engine.has_unfinished() else []
        if self.queued:
            self._note_scheduled(deltas)
        self._publish(deltas)

    def _drain_inbox(self, block: bool) -> None:
        if block and not self.poller.poll(IDLE_POLL_MS):
            return
        while True:
            try:
                frame = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._handle(self.decoder.decode(frame.buffer))

    def _handle(self, msg) -> None:
        if isinstance(msg, EngineRequest):
            arrival = time.time()
            try:
                self.engine.add_request(msg.request_id, msg.prompt_token_ids, msg.sampling_params,
                                        arrival_time=arrival)
                self.queued[msg.request_id] = arrival
            except ValueError as exc:
                logger.warning("request %s refused: %s", msg.request_id, exc)
                self.error_deltas.append(TokenDelta(msg.request_id, [], finish_reason="error", error=str(exc)))
        elif isinstance(msg, AbortRequest):
            for request_id in msg.request_ids:
                self.engine.abort(request_id)  # unknown or finished ids are harmless
                self.queued.pop(request_id, None)
        else:
            raise AssertionError(f"unexpected message for the engine: {type(msg).__name__}")

    def _note_scheduled(self, deltas: list[TokenDelta]) -> None:
        """Requests that left the waiting queue in this step: running now, or already finished."""
        now = time.time()
        left = [req.request_id for req in self.engine.scheduler.running]
        left += [d.request_id for d in deltas if d.finish_reason is not None]
        for request_id in left:
            arrival = self.queued.pop(request_id, None)
            if arrival is not None:
                self.queue_times.append(now - arrival)

    def _publish(self, deltas: list[TokenDelta]) -> None:
        s = self.engine.stats()
        gauges = (s.num_running, s.num_waiting, s.kv_cache_usage, s.prefix_cache_queries, s.prefix_cache_hits,
                  s.num_preemptions)
        stats = None
        if gauges != self.last_gauges or self.queue_times:
            stats = EngineStats(*gauges, queue_times=self.queue_times)
            self.last_gauges, self.queue_times = gauges, []
        if self.error_deltas:
            deltas, self.error_deltas = self.error_deltas + deltas, []
        if deltas or stats is not None:
            self.outbox.send(EngineOutputs(deltas=deltas, stats=stats))
