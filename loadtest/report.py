"""Results out: one record per (target, level) run, the printed comparison table, results.json.

The table has one block per sweep level: a row per figure, a column per target, and for each
target after the first a column with its ratio to the first target (value / first's value;
above 1 means more throughput, or more latency). results.json holds the settings and, for every
run, vLLM's summary keys and the per-request lists (ttfts, itls, e2els, output_lens, ...).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Any

from loadtest.config import LoadTestConfig
from loadtest.metrics import compute_metrics
from loadtest.runner import LevelRun, RunState, level_label

# (label, metrics key); latency rows are filled in per kind below.
THROUGHPUT_ROWS = [
    ("Request throughput (req/s)", "request_throughput"),
    ("Request goodput (req/s)", "request_goodput"),
    ("Output token throughput (tok/s)", "output_throughput"),
    ("Total token throughput (tok/s)", "total_token_throughput"),
]
LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E"}
STAT_NAMES = [("mean", "mean"), ("median", "median"), ("p90", "p90"), ("p99", "p99")]


def run_record(run: LevelRun, config: LoadTestConfig) -> dict[str, Any]:
    """Everything about one run, ready for JSON: who, at which level, and compute_metrics()."""
    record: dict[str, Any] = {
        "target": run.target.name,
        "base_url": run.target.base_url,
        "model_id": run.endpoint.model,
        "endpoint": run.endpoint.kind,
        "max_concurrency": run.max_concurrency,
        "request_rate": config.request_rate if config.request_rate is not None else "inf",
        "burstiness": config.burstiness,
        "num_prompts": config.num_prompts,
        "aborted": run.aborted,
    }
    # Results arrive in completion order, which depends on timing; list them in send order.
    results = sorted(run.results, key=lambda r: r.start_time)
    record.update(compute_metrics(results, run.duration_s, config.slo))
    return record


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _ratio(value: Any, first: Any) -> str:
    if not isinstance(value, (int, float)) or not isinstance(first, (int, float)) or first == 0:
        return "-"
    return f"{value / first:.2f}x"


def _rows() -> list[tuple[str, str]]:
    rows = list(THROUGHPUT_ROWS)
    for short, name in LATENCY_NAMES.items():
        rows += [(f"{name} {label} (ms)", f"{stat}_{short}_ms") for label, stat in STAT_NAMES]
    return rows


def format_tables(records: list[dict[str, Any]], stopped_reason: str | None) -> str:
    """One text block per level, in the order the levels ran."""
    lines: list[str] = []
    levels: list[Any] = list(dict.fromkeys(r["max_concurrency"] for r in records))
    for level in levels:
        block = [r for r in records if r["max_concurrency"] == level]
        first = block[0]
        rate = first["request_rate"]
        lines.append(f"\n=== max concurrency {level_label(level)}, request rate {rate} req/s ===")
        header = ["", *[r["target"] for r in block]] + [f"{r['target']}/{first['target']}" for r in block[1:]]
        table = [
            header,
            ["Completed / failed", *[f"{r['completed']} / {r['failed']}" for r in block]] + [""] * (len(block) - 1),
        ]
        for label, key in _rows():
            if key == "request_goodput" and first[key] is None:
                continue
            table.append([label, *[_fmt(r[key]) for r in block]] + [_ratio(r[key], first[key]) for r in block[1:]])
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            lines.append(
                "  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
            )
        for r in block:
            lines.extend(_notes(r))
    if stopped_reason:
        lines.append(f"\nRun stopped early ({stopped_reason}): the figures cover only what finished before that.")
    return "\n".join(lines)


def _notes(record: dict[str, Any]) -> list[str]:
    notes = []
    name = record["target"]
    if record["error_counts"]:
        counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(record["error_counts"].items()))
        notes.append(f"  {name}: errors ({counts}); excluded from the latency figures")
    if record["aborted"]:
        notes.append(f"  {name}: {record['aborted']} request(s) in flight were aborted when the run stopped")
    if record["usage_missing"]:
        notes.append(
            f"  WARNING {name}: {record['usage_missing']} request(s) streamed no usage chunk; their output "
            "tokens were counted as content chunks (undercounts when a chunk carries several tokens)"
        )
    return notes


def _json_safe(value: Any) -> Any:
    """NaN/inf are not JSON; None is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_json(
    path: Path,
    config: LoadTestConfig,
    state: RunState,
    records: list[dict[str, Any]],
    started_at: datetime.datetime,
) -> None:
    settings = dataclasses.asdict(config)
    if settings.get("api_key"):
        settings["api_key"] = "<redacted>"
    document = {
        "date": started_at.isoformat(timespec="seconds"),
        "stopped_reason": state.stopped_reason,
        "requests_sent": state.requests_sent,
        "config": settings,
        "runs": records,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_json_safe(document), indent=1), encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a file, even if we are stopped while writing
