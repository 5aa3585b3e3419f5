"""PNG plots of the run records (matplotlib, Agg backend: no display needed).

- latency_c{level}.png per sweep level: empirical CDFs of TTFT and of pooled ITL, one line per
  target. CDFs rather than histograms so several targets stay readable on one axis.
- sweep.png when there is more than one level: output token throughput and p99 TTFT against
  max concurrency, one line per target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend has to be chosen first)
import numpy as np  # noqa: E402

from loadtest.runner import level_label  # noqa: E402


def _cdf(ax: Any, values_ms: list[float], label: str) -> None:
    if not values_ms:
        return
    xs = np.sort(np.asarray(values_ms))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")


def plot_latency(records: list[dict[str, Any]], path: Path) -> None:
    """records: the runs of one level, one per target."""
    fig, (ax_ttft, ax_itl) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in records:
        _cdf(ax_ttft, [t * 1000 for t in r["ttfts"] if t is not None], r["target"])
        _cdf(ax_itl, [gap * 1000 for gaps in r["itls"] for gap in gaps], r["target"])
    for ax, name in ((ax_ttft, "TTFT"), (ax_itl, "ITL (per chunk, pooled)")):
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of samples")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="lower right")
    fig.suptitle(f"Latency CDF, max concurrency {level_label(records[0]['max_concurrency'])}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(records: list[dict[str, Any]], path: Path) -> None:
    """records: every run; x is the concurrency level (log scale), one line per target."""
    fig, (ax_tput, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for target in dict.fromkeys(r["target"] for r in records):
        runs = [r for r in records if r["target"] == target and r["max_concurrency"] is not None]
        xs = [r["max_concurrency"] for r in runs]
        ax_tput.plot(xs, [r["output_throughput"] or 0.0 for r in runs], marker="o", label=target)
        ax_ttft.plot(
            xs, [r["p99_ttft_ms"] if r["p99_ttft_ms"] is not None else np.nan for r in runs], marker="o", label=target
        )
    for ax, ylabel in ((ax_tput, "output tokens/s"), (ax_ttft, "p99 TTFT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Concurrency sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write every plot that the records support; returns the files written."""
    written: list[Path] = []
    levels = list(dict.fromkeys(r["max_concurrency"] for r in records))
    for level in levels:
        path = out_dir / f"latency_c{level_label(level)}.png"
        plot_latency([r for r in records if r["max_concurrency"] == level], path)
        written.append(path)
    if len([level for level in levels if level is not None]) > 1:
        path = out_dir / "sweep.png"
        plot_sweep(records, path)
        written.append(path)
    return written
