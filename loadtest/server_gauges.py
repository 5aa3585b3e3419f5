"""The engine gauges of a server's Prometheus /metrics, under vLLM's names (ours use them too)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
          "vllm:kv_cache_usage_perc": "kv_usage"}


async def read_gauges(http: httpx.AsyncClient, metrics_url: str) -> dict[str, float]:
    """{"running", "waiting", "kv_usage"} summed over the label sets (one per model); empty when
    /metrics cannot be read, so a sample records the gap instead of stopping the soak."""
    try:
        response = await http.get(metrics_url, timeout=10)
        if response.status_code != 200:
            return {}
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name in GAUGES:
                    key = GAUGES[sample.name]
                    values[key] = values.get(key, 0.0) + sample.value
        return values
    except (httpx.HTTPError, ValueError):
        return {}
