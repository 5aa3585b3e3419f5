"""Prometheus metrics under vLLM's names, so existing dashboards and routers work unchanged.

Gauges and the cache/preemption counters come from the engine's EngineStats (cumulative counts,
turned into increments here); latencies are measured in this process as clients see them, one
RequestMetrics per request: TTFT to the first text, ITL between text deltas of a choice, E2E to
the end of the request. Counters get prometheus_client's `_total` suffix, as vLLM's do.

The roofline metrics (`llm:` prefix, ours) come from the engine, one observation per step: the
share of the machine's memory bandwidth and of its peak FLOP/s that the step's model bytes and
FLOPs used over its wall time, and per operator the step's time lower bound, summed. In Grafana,
`rate(llm:step_operator_lower_bound_seconds_total[1m]) / ignoring(operator) group_left
rate(llm:step_seconds_total[1m])` is the fraction of engine step time each operator needs at
the roofline; what the operators leave of 1 is time above it (host work, kernels off their roof).
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from common.messages import EngineStats, FinishReason, RooflineStats, TextDelta

# vLLM's buckets.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISHED_REASONS = ("stop", "length", "abort", "error")
# 0.05 .. 1.0 in steps of 0.05, then a little room above 1 (a roof underestimated, or CUDA steps
# whose kernels finished in the next step's time)
UTILIZATION_BUCKETS = [round(0.05 * i, 2) for i in range(1, 21)] + [1.25, 1.5, 2.0]

disable_created_metrics()  # no `_created` series, as in vLLM (process-wide; this is the server process)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        label = {"model_name": model_name}

        def gauge(name, doc):
            return Gauge(name, doc, list(label), registry=r).labels(**label)

        def counter(name, doc):
            return Counter(name, doc, list(label), registry=r).labels(**label)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, list(label), buckets=buckets, registry=r).labels(**label)

        self.num_requests_running = gauge("vllm:num_requests_running", "Sequences in the engine's running batch.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Sequences waiting to be scheduled.")
        self.kv_cache_usage_perc = gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100 percent).")
        # vLLM's earlier name of the same gauge, which vLLM's production-stack router and many
        # autoscaling examples still read (docs/scale-out.md)
        self.gpu_cache_usage_perc = gauge("vllm:gpu_cache_usage_perc", "KV cache usage (1 = 100 percent); "
                                          "the same as vllm:kv_cache_usage_perc, on every device.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = counter("vllm:num_preemptions", "Preemptions (by recompute) in the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between text deltas of a choice.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to last token.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Time waiting for the first schedule.",
                                    REQUEST_LATENCY_BUCKETS)
        success = Counter("vllm:request_success", "Finished choices, by finish reason.",
                          ["model_name", "finished_reason"], registry=r)
        self.request_success = {reason: success.labels(model_name=model_name, finished_reason=reason)
                                for reason in FINISHED_REASONS}
        self.detokenize_mismatch = counter(
            "llm:detokenize_mismatch", "Finished choices whose streamed text differed from a full decode of their "
                                       "tokens (the tokenizer worker's self-check; --no-detokenize-check: off).")
        self._last_engine_counts = (0, 0, 0)
        # Speculative decoding (vLLM's spec_decode counters); per position: drafts accepted at least
        # that far, position 0 = the first draft token.
        self.spec_num_drafts = counter("vllm:spec_decode_num_drafts", "Drafts verified.")
        self.spec_num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self._spec_per_position = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Draft tokens accepted, by position in the draft.",
                                          ["model_name", "position"], registry=r)
        self._model_name = model_name
        self.step_bandwidth_utilization = histogram(
            "llm:step_bandwidth_utilization", "Per engine step: model bytes / (wall time x machine bandwidth).",
            UTILIZATION_BUCKETS)
        self.step_compute_utilization = histogram(
            "llm:step_compute_utilization", "Per engine step: model FLOPs / (wall time x machine peak FLOP/s).",
            UTILIZATION_BUCKETS)
        self.step_seconds = counter("llm:step_seconds", "Wall time of the engine's steps.")
        self._operator_lower_bound = Counter(
            "llm:step_operator_lower_bound_seconds",
            "Per operator, its time lower bound max(FLOPs / peak, bytes / bandwidth), summed over the steps.",
            ["model_name", "operator"], registry=r)

    def on_engine_stats(self, s: EngineStats) -> None:
        self.num_requests_running.set(s.num_running)
        self.num_requests_waiting.set(s.num_waiting)
        self.kv_cache_usage_perc.set(s.kv_cache_usage)
        self.gpu_cache_usage_perc.set(s.kv_cache_usage)
        counts = (s.prefix_cache_queries, s.prefix_cache_hits, s.num_preemptions)
        for counter, now, before in zip((self.prefix_cache_queries, self.prefix_cache_hits, self.num_preemptions),
                                        counts, self._last_engine_counts, strict=True):
            if now > before:
                counter.inc(now - before)
        self._last_engine_counts = counts
        for seconds in s.queue_times:
            self.queue_time.observe(seconds)
        if s.spec_decode is not None:
            spec = s.spec_decode
            self.spec_num_drafts.inc(spec.num_drafts)
            self.spec_num_draft_tokens.inc(spec.num_draft_tokens)
            self.spec_num_accepted_tokens.inc(spec.num_accepted_tokens)
            for position, count in enumerate(spec.accepted_per_position):
                self._spec_per_position.labels(model_name=self._model_name, position=str(position)).inc(count)
        if s.roofline is not None:
            self._on_roofline(s.roofline)

    def _on_roofline(self, roofline: RooflineStats) -> None:
        for value in roofline.bandwidth_utilization:
            self.step_bandwidth_utilization.observe(value)
        for value in roofline.compute_utilization:
            self.step_compute_utilization.observe(value)
        self.step_seconds.inc(roofline.wall_s)
        for operator, seconds in roofline.operator_lower_bound_s.items():
            self._operator_lower_bound.labels(model_name=self._model_name, operator=operator).inc(seconds)

    def on_finished_choice(self, reason: FinishReason) -> None:
        self.request_success[reason].inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """The observations of one request, from its arrival at the server (perf_counter seconds)."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.arrival = time.perf_counter()
        self.first_text_at: float | None = None
        self.last_text_at: dict[int, float] = {}  # per choice

    def on_accepted(self, num_prompt_tokens: int) -> None:
        self.metrics.prompt_tokens.inc(num_prompt_tokens)

    def on_delta(self, delta: TextDelta, now: float) -> None:
        m = self.metrics
        m.generation_tokens.inc(delta.num_new_tokens)
        if delta.text:
            if self.first_text_at is None:
                self.first_text_at = now
                m.ttft.observe(now - self.arrival)
            last = self.last_text_at.get(delta.index)
            if last is not None:
                m.itl.observe(now - last)
            self.last_text_at[delta.index] = now
        if delta.finish_reason is not None:
            m.on_finished_choice(delta.finish_reason)
        if delta.usage is not None:
            m.e2e.observe(now - self.arrival)

    def on_aborted(self, num_unfinished_choices: int) -> None:
        """The client left: its unfinished choices count as aborted."""
        for _ in range(num_unfinished_choices):
            self.metrics.on_finished_choice("abort")
