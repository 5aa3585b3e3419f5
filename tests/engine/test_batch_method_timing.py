"""The start-up timing that picks each shape's batch method (engine/models/group_quantized.py):
the alternatives take turns within each round, and each keeps its fastest pass, so a burst of
other work on the machine (another server starting) lands on both and cannot decide alone."""
from __future__ import annotations

import time

import torch

from engine.models.group_quantized import _cold_seconds


def test_alternatives_take_turns_and_keep_their_fastest_pass():
    order: list[str] = []
    slow_first = iter([0.0, 0.05])  # "a" is disturbed in its first timed pass (after the warm-up call)

    def a():
        order.append("a")
        time.sleep(next(slow_first, 0.0) + 0.002)

    def b():
        order.append("b")
        time.sleep(0.01)

    seconds = _cold_seconds([[a], [b]], torch.zeros(1 << 10, dtype=torch.uint8), rounds=3)
    assert order == ["a", "b"] + ["a", "b"] * 3  # one untimed warm-up call each, then turns
    assert seconds[0] < seconds[1]  # the disturbed pass did not make "a" lose
    assert 0.002 <= seconds[0] < 0.01 and seconds[1] >= 0.01
