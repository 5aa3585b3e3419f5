"""The soak's samples, their trends, and the report: text, soak.json and soak.png.

RSS growth per hour is the least-squares slope of RSS over time, fitted after the warm-up (the
first WARMUP_FRACTION of the run, at least WARMUP_MIN_S): allocators, caches and the prefix
cache fill up at first, which is not a leak. With fewer than 3 samples after it, all are used.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.process_stats import ProcessSample
from loadtest.soak_traffic import KINDS, Outcome

WARMUP_FRACTION = 0.1
WARMUP_MIN_S = 30.0
MIB = 1 << 20


@dataclass
class Sample:
    t: float  # seconds since the soak started
    processes: list[ProcessSample]
    gauges: dict[str, float]  # running, waiting, kv_usage (empty when /metrics failed)
    sent: int
    in_flight: int
    lost: int
    errors: int

    def is_idle(self) -> bool:
        return (self.in_flight == 0 and bool(self.gauges) and self.gauges.get("running", 0) == 0
                and self.gauges.get("waiting", 0) == 0 and self.gauges.get("kv_usage", 0) == 0)


def format_sample(s: Sample) -> str:
    procs = "  ".join(f"{p.name} {p.rss_bytes / MIB:.0f}MiB/{p.num_fds}fd" for p in s.processes)
    g = s.gauges
    engine = (f"running {g.get('running', 0):.0f} waiting {g.get('waiting', 0):.0f} kv {g.get('kv_usage', 0):.1%}"
              if g else "/metrics unreadable")
    return (f"[{s.t:7.0f} s] sent {s.sent} in flight {s.in_flight} lost {s.lost} errors {s.errors} | {engine}"
            f" | {procs}")


def slope_per_hour(ts: list[float], values: list[float]) -> float | None:
    """Least-squares slope of values over ts, per hour; None with fewer than 2 points or no spread."""
    if len(ts) < 2 or max(ts) - min(ts) <= 0:
        return None
    return float(np.polyfit(np.asarray(ts), np.asarray(values, dtype=float), 1)[0]) * 3600.0


@dataclass
class Summary:
    text: str
    clean: bool
    figures: dict[str, Any] = field(default_factory=dict)


def _process_trends(samples: list[Sample], duration_s: float) -> dict[str, dict[str, Any]]:
    warmup = max(WARMUP_MIN_S, WARMUP_FRACTION * duration_s)
    names = list(dict.fromkeys(p.name for s in samples for p in s.processes))
    trends = {}
    for name in names:
        points = [(s.t, p) for s in samples for p in s.processes if p.name == name]
        after = [(t, p) for t, p in points if t >= warmup]
        fit = after if len(after) >= 3 else points
        rss = [p.rss_bytes / MIB for _, p in points]
        fds = [p.num_fds for _, p in points]
        trends[name] = {
            "rss_mib_first": rss[0], "rss_mib_last": rss[-1], "rss_mib_max": max(rss),
            "rss_growth_mib_per_hour": slope_per_hour([t for t, _ in fit], [p.rss_bytes / MIB for _, p in fit]),
            "fds_first": fds[0], "fds_last": fds[-1], "fds_max": max(fds),
        }
    return trends


def report(samples: list[Sample], outcomes: list[Outcome], duration_s: float) -> Summary:
    counts = Counter((o.kind, o.result) for o in outcomes)
    lost = [o for o in outcomes if o.result == "lost"]
    errors = Counter(o.detail for o in outcomes if o.result == "error")
    trends = _process_trends(samples, duration_s)
    with_gauges = [s for s in samples if s.gauges]
    final = samples[-1] if samples else None
    # None: the server has no readable /metrics, so its idleness cannot be checked.
    idle_at_end = (final is not None and final.is_idle()) if with_gauges else None
    kv_max = max((s.gauges.get("kv_usage", 0.0) for s in with_gauges), default=None)
    running_max = max((s.gauges.get("running", 0.0) for s in with_gauges), default=None)
    lines = ["", f"=== soak: {len(outcomes)} requests over {final.t if final else 0:.0f} s, {len(samples)} samples ==="]
    lines.append(f"{'kind':<10}{'sent':>8}{'ok':>8}{'error':>8}{'lost':>8}")
    for kind in KINDS:
        row = [sum(counts[(kind, r)] for r in ("ok", "error", "lost"))] + [counts[(kind, r)] for r in
                                                                           ("ok", "error", "lost")]
        lines.append(f"{kind:<10}" + "".join(f"{v:>8}" for v in row))
    if errors:
        lines.append("errors: " + ", ".join(f"{k} x{v}" for k, v in errors.most_common()))
    for outcome in lost[:10]:
        lines.append(f"lost: {outcome.kind}: {outcome.detail}")
    lines.append(f"{'process':<18}{'RSS first':>11}{'last':>9}{'max':>9}{'MiB/hour':>10}{'FDs first':>11}"
                 f"{'last':>6}{'max':>6}")
    for name, t in trends.items():
        growth = t["rss_growth_mib_per_hour"]
        lines.append(f"{name:<18}{t['rss_mib_first']:>10.0f}M{t['rss_mib_last']:>8.0f}M{t['rss_mib_max']:>8.0f}M"
                     f"{'n/a' if growth is None else f'{growth:+.1f}':>10}{t['fds_first']:>11}{t['fds_last']:>6}"
                     f"{t['fds_max']:>6}")
    if final is not None and final.gauges:
        lines.append(f"engine: KV usage max {kv_max:.1%}, at the end {final.gauges.get('kv_usage', 0):.1%}; running "
                     f"max {running_max:.0f}, at the end {final.gauges.get('running', 0):.0f}")
    clean = not lost and not errors and idle_at_end is not False
    idle_text = {True: "back to idle", False: "NOT back to idle", None: "no /metrics: idle not checked"}[idle_at_end]
    lines.append(f"result: {'clean' if clean else 'NOT clean'} ({len(lost)} lost, {sum(errors.values())} errors, "
                 f"{idle_text})")
    figures = {"requests": len(outcomes), "lost": len(lost), "errors": dict(errors), "idle_at_end": idle_at_end,
               "by_kind": {k: {r: counts[(k, r)] for r in ("ok", "error", "lost")} for k in KINDS},
               "processes": trends, "kv_usage_max": kv_max, "running_max": running_max,
               "final_gauges": final.gauges if final else {}, "lost_details": [o.detail for o in lost[:100]]}
    return Summary("\n".join(lines), clean, figures)


def write_outputs(out_dir: Path, config: Any, samples: list[Sample], outcomes: list[Outcome],
                  summary: Summary) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"config": asdict(config), "summary": summary.figures, "clean": summary.clean,
           "samples": [asdict(s) for s in samples]}
    (out_dir / "soak.json").write_text(json.dumps(doc, indent=1))
    _plot(out_dir / "soak.png", samples)


def _plot(path: Path, samples: list[Sample]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    ts = [s.t / 60 for s in samples]
    for name in dict.fromkeys(p.name for s in samples for p in s.processes):
        rows = [(s.t / 60, p) for s in samples for p in s.processes if p.name == name]
        axes[0].plot([t for t, _ in rows], [p.rss_bytes / MIB for _, p in rows], label=name)
        axes[1].plot([t for t, _ in rows], [p.num_fds for _, p in rows], label=name)
    axes[2].plot(ts, [100 * s.gauges.get("kv_usage", float("nan")) for s in samples])
    axes[3].plot(ts, [s.gauges.get("running", float("nan")) for s in samples], label="running")
    axes[3].plot(ts, [s.gauges.get("waiting", float("nan")) for s in samples], label="waiting")
    for ax, label in zip(axes, ("RSS (MiB)", "open FDs", "KV usage (%)", "requests"), strict=True):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
    axes[3].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
