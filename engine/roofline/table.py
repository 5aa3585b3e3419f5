"""The roofline table of one step: per operator GFLOP, GB, intensity (FLOP/byte) and its time
lower bound in ms, then the step's total lower bound (the sum: the operators run one after another)."""
from __future__ import annotations

from engine.roofline.cost_model import OperatorCost
from engine.roofline.machine import MachineLimits

HEADER = f"{'operator':<14}{'GFLOP':>9}{'GB':>8}{'FLOP/B':>8}{'bound ms':>12}"


def format_table(costs: dict[str, OperatorCost], limits: MachineLimits) -> list[str]:
    lines = [HEADER]
    total_s = 0.0
    for name, cost in costs.items():
        bound_s = limits.lower_bound_s(cost)
        total_s += bound_s
        lines.append(f"{name:<14}{cost.flops / 1e9:>9.1f}{cost.bytes / 1e9:>8.2f}{cost.intensity:>8.1f}"
                     f"{bound_s * 1e3:>12.2f}")
    lines.append(f"{'total':<39}{total_s * 1e3:>14.2f}")
    return lines
