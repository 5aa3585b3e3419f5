"""The engine process loop on a tiny random-weight model, between real ZMQ sockets: bad requests
become error deltas (the loop goes on), aborts free everything, gauges go out when they change,
and a busy engine sends its stats at most every STATS_INTERVAL_S, nothing lost in between."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec
import zmq

from common.engine_config import EngineConfig
from engine import engine_process
from engine.engine_process import EngineLoop
from common.ipc import Channel, IpcPaths, open_socket
from engine.llm_engine import LLMEngine
from common.messages import AbortRequest, EngineOutputs, EngineRequest, FromEngine, SamplingParams


class ManualClock:
    """The loop's clock in seconds, moved only by the test: when stats are due depends on the
    steps and the moves, never on how fast this machine runs them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def engine_loop(model_dir: str, clock: Callable[[], float] = time.monotonic
                ) -> Iterator[tuple[LLMEngine, Channel, Callable[[int], list[EngineOutputs]]]]:
    """(engine, the channel into its loop, run(steps) -> the outputs those steps sent)."""
    paths = IpcPaths.create()
    ctx = zmq.Context()
    try:
        inbox = open_socket(ctx, zmq.PULL, paths.to_engine, bind=True)
        outputs = open_socket(ctx, zmq.PULL, paths.from_engine, bind=True)
        to_engine = Channel(open_socket(ctx, zmq.PUSH, paths.to_engine, bind=False))
        engine = LLMEngine(EngineConfig(model=model_dir, dtype="float32", device="cpu", max_model_len=64,
                                        kv_cache_memory=1 << 20))
        loop = EngineLoop(engine, inbox, Channel(open_socket(ctx, zmq.PUSH, paths.from_engine, bind=False)), clock)
        decoder = msgspec.msgpack.Decoder(FromEngine)

        def run(steps: int) -> list[EngineOutputs]:
            inbox.poll(1000)  # what the test just sent has arrived (ipc delivery is asynchronous)
            for _ in range(steps):
                loop.run_once()
            got = []
            while outputs.poll(100):
                got.append(decoder.decode(outputs.recv()))
            return got

        yield engine, to_engine, run
    finally:
        ctx.destroy(linger=0)
        paths.remove()


def test_engine_loop(tiny_llama_dir):
    with engine_loop(tiny_llama_dir) as (engine, to_engine, run):
        greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        to_engine.send(EngineRequest("ok", [5, 6, 7], greedy))
        to_engine.send(EngineRequest("bad", [5, 6, 7], SamplingParams(n=2)))  # the engine runs n=1 only
        to_engine.send(EngineRequest("long", [5] * 10, SamplingParams(max_tokens=60)))  # > max_model_len
        to_engine.send(AbortRequest(["never-seen"]))
        first = run(1)
        deltas = {d.request_id: d for out in first for d in out.deltas}
        assert deltas["bad"].finish_reason == "error" and deltas["bad"].error.startswith("n:")
        assert deltas["long"].finish_reason == "error" and "max_model_len" in deltas["long"].error
        assert deltas["ok"].new_token_ids and first[-1].stats.num_running == 1
        assert first[-1].stats.kv_cache_usage > 0 and len(first[-1].stats.queue_times) == 1

        to_engine.send(EngineRequest("slow", [9, 8, 7], SamplingParams(temperature=0, max_tokens=50)))
        rest = run(3)
        ok = [d for out in rest for d in out.deltas if d.request_id == "ok"]
        assert ok[-1].finish_reason == "length"
        to_engine.send(AbortRequest(["slow"]))
        after_abort = run(1)
        stats = after_abort[-1].stats  # the abort changed the gauges, so they are sent
        assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
        assert not engine.has_unfinished()


def test_busy_engine_sends_stats_at_most_every_interval(tiny_llama_dir):
    interval = engine_process.STATS_INTERVAL_S
    clock = ManualClock()
    with engine_loop(tiny_llama_dir, clock) as (engine, to_engine, run):
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        to_engine.send(EngineRequest("a", [5, 6, 7], params))
        first = run(1)
        assert first[-1].stats is not None and first[-1].stats.num_running == 1  # the first step's: due at once

        to_engine.send(EngineRequest("b", [7, 6, 5], params))
        clock.advance(interval * 0.9)  # three steps inside the interval: tokens go out, stats wait
        quick = run(3)
        assert all(out.stats is None for out in quick) and all(out.deltas for out in quick)

        clock.advance(interval * 0.2)  # past the interval since the first step's stats
        due = run(1)[-1].stats
        assert due is not None and due.num_running == 2
        assert len(due.queue_times) == 1  # b's, kept from the step that admitted it
        assert all(out.stats is None for out in run(2))  # the interval starts again from that look

        to_engine.send(AbortRequest(["a", "b"]))
        idle = run(1)[-1].stats  # out of work: sent at once, inside the interval
        assert idle is not None and (idle.num_running, idle.kv_cache_usage) == (0, 0.0)
        assert not engine.has_unfinished()
