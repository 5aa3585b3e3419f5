"""The engine process: owns an LLMEngine and runs its steps, fed by the tokenizer worker.

Between two steps it drains its input queue without blocking (new requests, aborts); it blocks
on the socket only when it has nothing to run. After each step it sends one EngineOutputs with
the step's TokenDeltas and, when they changed or there are observations to pass on (queue times,
the step's roofline), the scheduler/cache gauges. A request the engine
refuses (ValueError from add_request) gets an error delta; it never stops the loop.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec
import zmq

from common.child_process import IDLE_POLL_MS, ParentWatch, run_child
from common.engine_config import EngineConfig
from common.gc_heap import freeze_startup_heap
from common.ipc import Channel, IpcPaths, drain, open_socket
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
        freeze_startup_heap()  # the model, torch, the caches: no full collection walks them again
        outbox.send(EngineReady(num_kv_tokens=engine.num_kv_tokens, max_model_len=engine.max_model_len,
                                vocab_size=engine.vocab_size, device=str(engine.device),
                                dtype=str(engine.dtype).removeprefix("torch."), model_dir=str(engine.model_dir),
                                eos_token_ids=sorted(engine.eos_token_ids),
                                generation_defaults=engine.generation_defaults))
        EngineLoop(engine, inbox, outbox).run()

    run_child(PROCESS_NAME, log_level, paths.from_engine, body)


COMPILE_POLL_MS = 5  # with nothing to run but requests whose grammar compiles: how often to look
# How often a busy engine sends its EngineStats (gauges, queue times, roofline, drafts): what a
# step observes accumulates until then, and an engine that runs out of work sends at once. Per step,
# the server's Prometheus updates cost about a sixth of its CPU per streamed token at concurrency 1.
STATS_INTERVAL_S = 0.25


class EngineLoop:
    def __init__(self, engine, inbox: zmq.Socket, outbox: Channel,
                 clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.clock = clock  # seconds; when stats are due (a test passes a clock it moves itself)
        self.inbox = inbox
        self.outbox = outbox
        self.decoder = msgspec.msgpack.Decoder(ToEngine)
        self.poller = zmq.Poller()
        self.poller.register(inbox, zmq.POLLIN)
        self.parent = ParentWatch()
        self.error_deltas: list[TokenDelta] = []
        self.last_gauges: EngineStats | None = None
        self.last_stats_at = float("-inf")  # self.clock() at the last look at the stats
        self.last_parent_check = self.clock()

    def run(self) -> None:
        while True:
            self.run_once()
            now = self.clock()
            if now - self.last_parent_check > IDLE_POLL_MS / 1000:
                self.last_parent_check = now
                self.parent.check()

    def run_once(self) -> None:
        """Take what arrived (waiting for it only when idle, or for a moment while the only work
        left is grammars compiling), run one step, send its output."""
        if not self.engine.has_unfinished():
            wait_ms = IDLE_POLL_MS
        elif self.engine.scheduler.only_compiling():
            wait_ms = COMPILE_POLL_MS
        else:
            wait_ms = 0
        self._drain_inbox(wait_ms)
        deltas = self.engine.step() if self.engine.has_unfinished() else []
        self._publish(deltas)

    def _drain_inbox(self, wait_ms: int) -> None:
        if wait_ms and not self.poller.poll(wait_ms):
            return
        for buffer in drain(self.inbox):
            self._handle(self.decoder.decode(buffer))

    def _handle(self, msg) -> None:
        if isinstance(msg, EngineRequest):
            try:
                self.engine.add_request(msg.request_id, msg.prompt_token_ids, msg.sampling_params)
            except ValueError as exc:
                logger.warning("request %s refused: %s", msg.request_id, exc)
                self.error_deltas.append(TokenDelta(msg.request_id, [], finish_reason="error", error=str(exc)))
        elif isinstance(msg, AbortRequest):
            for request_id in msg.request_ids:
                self.engine.abort(request_id)  # unknown or finished ids are harmless
        else:
            raise AssertionError(f"unexpected message for the engine: {type(msg).__name__}")

    def _publish(self, deltas: list[TokenDelta]) -> None:
        stats = self._stats_due()
        if self.error_deltas:
            deltas, self.error_deltas = self.error_deltas + deltas, []
        if deltas or stats is not None:
            self.outbox.send(EngineOutputs(deltas=deltas, stats=stats))

    def _stats_due(self) -> EngineStats | None:
        """What changed since the last look, once STATS_INTERVAL_S has passed since it or the
        engine has nothing left to run; else None (the counts keep accumulating in the engine)."""
        now = self.clock()
        if now - self.last_stats_at < STATS_INTERVAL_S and self.engine.has_unfinished():
            return None
        self.last_stats_at = now
        gauges = self.engine.stats()
        queue_times = self.engine.scheduler.take_queue_times()
        speculator = self.engine.scheduler.speculator
        spec = None if speculator is None else speculator.take_stats()
        roofline = self.engine.take_roofline_stats()
        if gauges == self.last_gauges and not queue_times and spec is None and roofline is None:
            return None
        self.last_gauges = gauges
        return msgspec.structs.replace(gauges, queue_times=queue_times, spec_decode=spec, roofline=roofline)
