"""The start-up timing that picks each shape's batch method (engine/models/group_quantized.py):
the alternatives take turns within each round, and each keeps its fastest pass, so a burst of
other work on the machine (another server starting) lands on both and cannot decide alone.

The timing reads `time.perf_counter` through the module's `time`; the test gives it a clock that
only the alternatives move, so the figures are exact whatever else runs on the machine."""
from __future__ import annotations

import types

import pytest
import torch

from engine.models import group_quantized
from engine.models.group_quantized import _cold_seconds


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_alternatives_take_turns_and_keep_their_fastest_pass(monkeypatch):
    clock = ManualClock()
    monkeypatch.setattr(group_quantized, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    order: list[str] = []
    slow_first = iter([0.0, 0.05])  # "a" is disturbed in its first timed pass (after the warm-up call)

    def a():
        order.append("a")
        clock.now += next(slow_first, 0.0) + 0.002

    def b():
        order.append("b")
        clock.now += 0.01

    seconds = _cold_seconds([[a], [b]], torch.zeros(1 << 10, dtype=torch.uint8), rounds=3)
    assert order == ["a", "b"] + ["a", "b"] * 3  # one untimed warm-up call each, then turns
    assert seconds == pytest.approx([0.002, 0.01])  # the disturbed pass (0.052) did not make "a" lose


def test_every_call_of_an_alternative_counts_and_caches_are_evicted_each_pass(monkeypatch):
    clock = ManualClock()
    monkeypatch.setattr(group_quantized, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    evict = torch.zeros(16, dtype=torch.uint8)

    def call(cost: float):
        def run():
            clock.now += cost
        return run

    seconds = _cold_seconds([[call(0.001), call(0.002)], [call(0.004)]], evict, rounds=2)
    assert seconds == pytest.approx([0.003, 0.004])  # a pass is every call of its list
    assert int(evict[0]) == 2 * 2  # written before each timed pass of each alternative
