"""The engine core's part of request traces: queue time, step time, and the delivery.

The runner records a traced request's prefill and first decode step (`engine/trace`); here each
record gets the time the request waited before its first step and the engine's whole step time
(schedule, runner, update), and goes out on the request's TokenDelta of that same step (every
recorded step samples the request, so it has one). Torch-free, like the rest of `engine/core`.
"""
from __future__ import annotations

import time

from common.messages import EngineTrace, TokenDelta
from engine.core.outputs import SchedulerOutput


class TraceDelivery:
    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}  # traced requests not scheduled yet: perf_counter at arrival
        self.queue_ms: dict[str, float] = {}  # traced requests scheduled, until they finish

    @property
    def active(self) -> bool:
        return bool(self.arrivals or self.queue_ms)

    def arrived(self, request_id: str) -> None:
        self.arrivals[request_id] = time.perf_counter()

    def drop(self, request_id: str) -> None:
        self.arrivals.pop(request_id, None)
        self.queue_ms.pop(request_id, None)

    def on_step(self, so: SchedulerOutput, traces: dict[str, EngineTrace] | None, deltas: list[TokenDelta],
                step_start: float) -> None:
        """After a step: queue times of the traced requests it scheduled first, its records onto
        their deltas, and the finished requests forgotten."""
        for request_id in [r for r in self.arrivals if r in so.num_scheduled_tokens]:
            self.queue_ms[request_id] = round((step_start - self.arrivals.pop(request_id)) * 1e3, 4)
        if traces:
            step_ms = round((time.perf_counter() - step_start) * 1e3, 4)
            for delta in deltas:
                trace = traces.get(delta.request_id)
                if trace is None:
                    continue
                trace.queue_ms = self.queue_ms.get(delta.request_id)
                for record in (trace.prefill, trace.decode):
                    if record is not None:
                        record.step_ms = step_ms
                delta.trace = trace
                if trace.decode is not None:  # its last record: nothing more to do for it
                    self.drop(delta.request_id)
        if self.active:
            for delta in deltas:
                if delta.finish_reason is not None:
                    self.drop(delta.request_id)
