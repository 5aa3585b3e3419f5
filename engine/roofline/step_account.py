"""Every engine step against the roofline: its model FLOPs and bytes from the scheduler's shapes,
divided by its measured wall time and the machine's limits.

Per step this is pure arithmetic over per-request integers (the scheduled tokens and the tokens
already computed, both in the SchedulerOutput; the sampled rows from the RunnerOutput), then the
cost model's per-model coefficients: a few microseconds next to a step of milliseconds. The
observations wait here until the engine loop sends them with its next EngineStats
(`take_stats`); the server turns them into the `llm:step_*` metrics.

Wall time is the engine's whole step (schedule, forward, sampling, update). On CUDA a step that
samples nothing has no host sync, so its kernels may finish inside the next step's time: such a
step can read above 1 and the next one lower.
"""
from __future__ import annotations

from common.messages import RooflineStats
from engine.core.outputs import RunnerOutput, SchedulerOutput
from engine.roofline.cost_model import OPERATORS, RooflineModel, StepShape
from engine.roofline.machine import MachineLimits


def step_shape(so: SchedulerOutput, ro: RunnerOutput) -> StepShape:
    """The totals of a step as the runner executed it (draft positions included)."""
    scheduled = so.num_scheduled_tokens
    num_tokens = pairs = context = 0
    for requests in (so.cached_requests, so.new_requests):
        for req in requests:
            query_len = scheduled.get(req.request_id)
            if query_len is None:  # not scheduled: nothing ran for it
                continue
            context_len = req.num_computed_tokens + query_len
            num_tokens += query_len
            context += context_len
            pairs += query_len * context_len - query_len * (query_len - 1) // 2
    num_sampled = len(ro.request_ids)
    for draft in so.spec_token_ids.values():  # a drafting request samples every draft position too
        num_sampled += len(draft)
    return StepShape(num_tokens, num_sampled, pairs, context)


class StepRoofline:
    def __init__(self, model: RooflineModel, limits: MachineLimits):
        self.model = model
        self.limits = limits
        self._inverse_peak = 1.0 / limits.peak_flops
        self._inverse_bandwidth = 1.0 / limits.bandwidth_bytes_per_s
        self._clear()

    def _clear(self) -> None:
        self.bandwidth_utilization: list[float] = []
        self.compute_utilization: list[float] = []
        self.lower_bound_s = dict.fromkeys(OPERATORS, 0.0)
        self.wall_s = 0.0

    def observe(self, so: SchedulerOutput, ro: RunnerOutput, seconds: float) -> None:
        shape = step_shape(so, ro)
        if not shape.num_tokens or seconds <= 0:
            return
        flops = num_bytes = 0.0
        inverse_peak, inverse_bandwidth, bounds = self._inverse_peak, self._inverse_bandwidth, self.lower_bound_s
        for name, cost in self.model.costs(shape).items():
            flops += cost.flops
            num_bytes += cost.bytes
            bounds[name] += max(cost.flops * inverse_peak, cost.bytes * inverse_bandwidth)
        self.bandwidth_utilization.append(num_bytes * inverse_bandwidth / seconds)
        self.compute_utilization.append(flops * inverse_peak / seconds)
        self.wall_s += seconds

    def take_stats(self) -> RooflineStats | None:
        """The steps observed since the last call; None when there were none."""
        if not self.bandwidth_utilization:
            return None
        stats = RooflineStats(self.bandwidth_utilization, self.compute_utilization, self.lower_bound_s, self.wall_s)
        self._clear()
        return stats
