"""add_request / abort / step / has_unfinished over a scheduler and a model runner.

One step is `schedule()` -> `runner.execute()` -> `update()`; it returns one TokenDelta per
request that produced tokens or finished. With async scheduling (`async_scheduling`, on by default
on CUDA) a step is scheduled and launched before the previous one's sampled ids are read: step()
schedules step N+1 as if they were known (counted as in flight), queues it, then reads step N's ids and
returns step N's deltas, so the host's work for N+1 overlaps the device's for N (SGLang's overlap
scheduler, vLLM's async scheduling). A step with drafts, a grammar or a traced request needs
the host to know every earlier token, so it waits for the step in flight first and runs alone.

Bad parameters raise InvalidRequest (a ValueError naming the field) in add_request, before
anything reaches the scheduler. The runner is anything with `execute(SchedulerOutput) ->
RunnerOutput` and `execute_async` (its output's `result()` gives that RunnerOutput later), so the
scheduler is testable without a model.
A `step_observer`, when set, sees every step that ran with its wall time (the roofline metrics).
Traced requests get their records' queue and step times here (`traces.py`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import msgspec

from common.errors import InvalidRequest
from common.messages import EngineStats, RooflineStats, SamplingParams, TokenDelta
from common.validation import resolve_max_tokens, validate_sampling_params
from engine.core.outputs import RunnerOutput, SchedulerOutput
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.traces import TraceDelivery


class PendingOutput(Protocol):
    def result(self) -> RunnerOutput: ...


class Runner(Protocol):
    def execute(self, so: SchedulerOutput) -> RunnerOutput: ...

    def execute_async(self, so: SchedulerOutput) -> PendingOutput: ...


@dataclass
class InFlight:
    """A step launched by async scheduling whose sampled ids the host has not read yet."""

    so: SchedulerOutput
    requests: dict[str, Request]  # the scheduled ones: an id can finish and be added again meanwhile
    output: PendingOutput
    started: float  # perf_counter when it was scheduled


class EventPublisher(Protocol):
    def publish(self, events: list) -> None: ...


class StepObserver(Protocol):
    def observe(self, so: SchedulerOutput, ro: RunnerOutput, seconds: float) -> None: ...

    def take_stats(self) -> RooflineStats | None: ...


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: Runner, vocab_size: int, max_model_len: int,
                 batch_invariant: bool = False, async_scheduling: bool = False):
        self.scheduler = scheduler
        self.runner = runner
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.batch_invariant = batch_invariant  # every request, whatever it asked
        self.step_observer: StepObserver | None = None
        self.traces = TraceDelivery()
        # drafts are verified on the host before the next step can be scheduled
        self.async_scheduling = async_scheduling and scheduler.speculator is None
        self.in_flight: InFlight | None = None
        self._last_read = time.perf_counter()  # when the host last read a step's ids (async)
        self.kv_event_publisher: EventPublisher | None = None  # set with block_manager.kv_events = []

    @property
    def requests(self) -> dict[str, Request]:
        return self.scheduler.requests

    @property
    def block_manager(self):
        return self.scheduler.block_manager

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams) -> None:
        if request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already running")
        validate_sampling_params(sampling_params, self.vocab_size)
        if sampling_params.n != 1:
            raise ValueError("n: the engine runs one sequence per request; fan out with common.parallel_sampling")
        if sampling_params.structured_outputs is not None and self.scheduler.structured is None:
            raise InvalidRequest("structured_outputs", "this engine runs without structured outputs")
        if sampling_params.lora is not None:
            self.check_lora(sampling_params)
        if self.batch_invariant and not sampling_params.batch_invariant:
            sampling_params = msgspec.structs.replace(sampling_params, batch_invariant=True)
        max_tokens = resolve_max_tokens(prompt_token_ids, self.vocab_size, sampling_params.max_tokens,
                                        self.max_model_len)
        self.scheduler.add_request(Request(request_id, prompt_token_ids, sampling_params, max_tokens))
        if sampling_params.trace:
            self.traces.arrived(request_id)

    def check_lora(self, sampling_params: SamplingParams) -> None:
        """Refuse a LoRA request this engine cannot run (InvalidRequest on `model`)."""
        raise InvalidRequest("model", "this engine serves no LoRA adapters (--enable-lora)")

    def abort(self, request_id: str) -> bool:
        """Free everything the request holds at once; False for an unknown (or finished) id."""
        if self.traces.active:
            self.traces.drop(request_id)
        return self.scheduler.abort(request_id)

    def step(self) -> list[TokenDelta]:
        deltas = self._step()
        if self.block_manager.kv_events:  # None unless KV cache events are published
            assert self.kv_event_publisher is not None
            self.kv_event_publisher.publish(self.block_manager.kv_events)  # a queue put; sent by its thread
            self.block_manager.kv_events = []
        return deltas

    def _step(self) -> list[TokenDelta]:
        if self.async_scheduling and not (self.scheduler.constrained or self.traces.active):
            return self._step_ahead()
        deltas = self._read_in_flight()  # this step must know every token before it is scheduled
        start = time.perf_counter()
        so = self.scheduler.schedule()
        failed = self.scheduler.take_failed()
        if not so.has_work_for_runner:
            return deltas + failed
        ro = self.runner.execute(so)
        step_deltas = self.scheduler.update(so, ro)
        if self.step_observer is not None:
            self.step_observer.observe(so, ro, time.perf_counter() - start)
        step_deltas = failed + step_deltas + self.scheduler.take_failed()
        if self.traces.active:
            self.traces.on_step(so, ro.traces, step_deltas, start)
        return deltas + step_deltas

    def _step_ahead(self) -> list[TokenDelta]:
        """Async scheduling: schedule and launch the next step, then read the one in flight."""
        start = time.perf_counter()
        so = self.scheduler.schedule()
        failed = self.scheduler.take_failed()
        launched = None
        if so.has_work_for_runner:
            self.scheduler.advance(so)  # progress and tokens in flight now: the next schedule builds on them
            scheduled = {rid: self.scheduler.requests[rid] for rid in so.num_scheduled_tokens}
            launched = InFlight(so, scheduled, self.runner.execute_async(so), start)
        deltas = self._read_in_flight()
        self.in_flight = launched
        if not self.scheduler.has_unfinished():  # the step just launched holds finished rows only:
            deltas += self._read_in_flight()   # read it now, not after the idle time until the next request
        return failed + deltas

    def _read_in_flight(self) -> list[TokenDelta]:
        """The deltas of the step in flight (async scheduling), once its sampled ids are read."""
        step, self.in_flight = self.in_flight, None
        if step is None:
            return []
        ro = step.output.result()
        now = time.perf_counter()
        deltas = self.scheduler.apply(step.so, ro, step.requests) + self.scheduler.take_failed()
        if self.step_observer is not None:  # its share of the wall time: from the later of its start and the last read
            self.step_observer.observe(step.so, ro, now - max(step.started, self._last_read))
        self._last_read = now
        return deltas

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def take_roofline_stats(self) -> RooflineStats | None:
        return None if self.step_observer is None else self.step_observer.take_stats()

    def stats(self) -> EngineStats:
        s, bm = self.scheduler, self.scheduler.block_manager
        return EngineStats(num_running=len(s.running), num_waiting=len(s.waiting), kv_cache_usage=bm.usage,
                           prefix_cache_queries=bm.prefix_queries, prefix_cache_hits=bm.prefix_hits,
                           num_preemptions=s.num_preemptions)
