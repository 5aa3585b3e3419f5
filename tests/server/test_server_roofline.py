"""The roofline metrics through the real server: after a request, /metrics has one utilization
observation per engine step, and the per-operator lower-bound counters (what the shares are is
this machine's pace against its measured limits: tests/engine/test_roofline.py checks their
arithmetic with the step time given)."""
from __future__ import annotations

import re

import httpx
import pytest
from openai import OpenAI

from engine.roofline.cost_model import OPERATORS

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"


def _samples(text: str, name: str) -> dict[str, float]:
    """Labels -> value of every sample of `name` (labels text as written, e.g. 'le="0.5",model_name=...')."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M)}


def test_steps_report_their_share_of_the_roofs(default_server):
    client = OpenAI(base_url=f"{default_server.url}/v1", api_key="none")
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 8
    text = httpx.get(f"{default_server.url}/metrics", timeout=30).text
    for name in ("llm:step_bandwidth_utilization", "llm:step_compute_utilization"):
        (count,) = _samples(text, f"{name}_count").values()
        (total,) = _samples(text, f"{name}_sum").values()
        assert count >= 8, name  # a prefill step, then one per decoded token
        assert total > 0, name  # the share itself depends on this machine's pace: test_roofline checks its arithmetic
        buckets = {labels: value for labels, value in _samples(text, f"{name}_bucket").items()}
        assert buckets[f'le="+Inf",model_name="{MODEL}"'] == count
    (wall_s,) = _samples(text, "llm:step_seconds_total").values()
    bounds = {re.search(r'operator="(\w+)"', labels).group(1): value
              for labels, value in _samples(text, "llm:step_operator_lower_bound_seconds_total").items()}
    assert set(bounds) == set(OPERATORS) and all(v > 0 for v in bounds.values())
    assert wall_s > 0 and sum(bounds.values()) > 0
