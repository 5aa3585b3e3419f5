"""Benchmark figures from per-request results, with vLLM's definitions and key names.

- TTFT: time to the first content chunk.  TPOT: (E2E - TTFT) / (output_tokens - 1), only for
  requests with more than one output token.  ITL: gaps between content chunks, pooled over all
  requests (a chunk carrying k tokens is one gap, as in vLLM).  E2E: send to end of stream.
- Throughputs divide by the wall time the requests were running (summed over rounds).
- Goodput: successful requests per second that meet every SLO given; a request with one output
  token has no TPOT and so cannot miss a TPOT SLO (vLLM counts its TPOT as 0).
- Failed requests count in "failed" and "error_counts" only, never in latency figures.
Latency keys are in milliseconds (mean_ttft_ms, p99_ttft_ms, ...), per-request lists in seconds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from loadtest.request import RequestResult

PERCENTILES = (50, 90, 99)  # 50 is reported as "median", the others as pNN
LATENCIES = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = ("ttft", "tpot", "e2el")


def latency_stats(name: str, values_s: list[float]) -> dict[str, float | None]:
    """mean/median/std/p90/p99 in ms; None for each when there are no values."""
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms"] + [
        f"p{p}_{name}_ms" for p in PERCENTILES if p != 50
    ]
    if not values_s:
        return dict.fromkeys(keys)
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    stats: dict[str, float | None] = {
        f"mean_{name}_ms": float(np.mean(ms)),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(np.std(ms)),
    }
    for p in PERCENTILES:
        if p != 50:
            stats[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return stats


def meets_slo(result: RequestResult, slo_ms: dict[str, float]) -> bool:
    if not result.success:
        return False
    assert result.ttft_s is not None and result.e2el_s is not None, "a success has TTFT and E2E"
    values_ms = {
        "ttft": result.ttft_s * 1000.0,
        "tpot": (result.tpot_s or 0.0) * 1000.0,  # undefined TPOT (one token) cannot be late
        "e2el": result.e2el_s * 1000.0,
    }
    return all(values_ms[key] <= limit for key, limit in slo_ms.items())


def compute_metrics(
    results: list[RequestResult],
    duration_s: float,
    slo_ms: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Summary figures plus per-request lists (aligned with `results`; None where undefined)."""
    assert all(key in SLO_KEYS for key in (slo_ms or {})), f"SLO keys are {SLO_KEYS}"
    ok = [r for r in results if r.success]
    # Prompt tokens: the server's count when it sent usage, else this tool's estimate.
    total_input = sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    per_second = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: None)
    metrics: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "error_counts": dict(Counter(r.error_kind for r in results if not r.success)),
        "usage_missing": sum(r.usage_missing for r in ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_second(len(ok)),
        "request_goodput": per_second(sum(meets_slo(r, slo_ms) for r in results)) if slo_ms else None,
        "output_throughput": per_second(total_output),
        "total_token_throughput": per_second(total_input + total_output),
    }
    metrics.update(latency_stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]))
    metrics.update(latency_stats("tpot", [t for r in ok if (t := r.tpot_s) is not None]))
    metrics.update(latency_stats("itl", [gap for r in ok for gap in r.itls_s]))
    metrics.update(latency_stats("e2el", [r.e2el_s for r in ok if r.e2el_s is not None]))
    # Per-request lists, vLLM's names; start_times are seconds from the first request's start.
    t0 = min((r.start_time for r in results), default=0.0)
    metrics.update(
        {
            "input_lens": [r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in results],
            "output_lens": [r.output_tokens if r.success else 0 for r in results],
            "ttfts": [r.ttft_s if r.success else None for r in results],
            "tpots": [r.tpot_s for r in results],
            "itls": [r.itls_s if r.success else [] for r in results],
            "e2els": [r.e2el_s if r.success else None for r in results],
            "start_times": [r.start_time - t0 for r in results],
            "errors": [r.error_kind + (f": {r.error_message}" if r.error_message else "") for r in results],
            "generated_texts": [r.generated_text for r in results],
        }
    )
    return metrics
