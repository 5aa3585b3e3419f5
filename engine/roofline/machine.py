"""A machine's two roofs: peak FLOP/s and memory bandwidth, with presets for common GPUs.

An operator's time lower bound is max(flops / peak_flops, bytes / bandwidth): under the ridge
(peak / bandwidth FLOP per byte) it is memory-bound, over it compute-bound. The presets are the
vendors' dense bf16 tensor rates and HBM bandwidths (SXM parts); `engine.roofline.measure` gives
the measured roofs of this host.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.roofline.cost_model import OperatorCost


@dataclass(frozen=True)
class MachineLimits:
    peak_flops: float  # FLOP/s
    bandwidth_bytes_per_s: float
    name: str

    @property
    def ridge(self) -> float:
        """FLOP per byte where the two roofs meet."""
        return self.peak_flops / self.bandwidth_bytes_per_s

    def lower_bound_s(self, cost: OperatorCost) -> float:
        return max(cost.flops / self.peak_flops, cost.bytes / self.bandwidth_bytes_per_s)

    def describe(self) -> str:
        return (f"{self.name}: {self.peak_flops / 1e12:.3g} TFLOP/s, {self.bandwidth_bytes_per_s / 1e9:.4g} GB/s, "
                f"ridge {self.ridge:.0f} FLOP/byte")


PRESETS = {
    "h100": MachineLimits(989e12, 3.35e12, "H100 SXM bf16"),
    "h200": MachineLimits(989e12, 4.8e12, "H200 SXM bf16"),
    "a100": MachineLimits(312e12, 2.039e12, "A100 SXM 80GB bf16"),
}
