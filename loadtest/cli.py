"""`python -m loadtest`: parse settings, check targets, run the load, print and write results.

Exit status: 0 when the run finished (or reached --max-requests / --max-duration), 1 when not a
single measured request succeeded, 2 for bad settings or an unreachable /models, 130 after
Ctrl-C (partial results are still printed and written).
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

from loadtest.client import Endpoint
from loadtest.config import LoadTestConfig, config_from_args
from loadtest.event_loop import run_event_loop
from loadtest.prompts import PromptSource
from loadtest.report import format_tables, run_record, write_json
from loadtest.runner import RunState, level_label, planned_requests, run_load
from loadtest.targets import Target, first_model, parse_targets


def _endpoints(config: LoadTestConfig, targets: list[Target], api_key: str | None) -> list[tuple[Target, Endpoint]]:
    endpoints = []
    for target in targets:
        model = config.model or first_model(target, api_key, timeout_s=min(config.timeout, 30.0))
        endpoints.append(
            (
                target,
                Endpoint(
                    base_url=target.base_url,
                    model=model,
                    kind=config.endpoint,
                    api_key=api_key,
                    temperature=config.temperature,
                    top_p=config.top_p,
                    ignore_eos=config.ignore_eos,
                    timeout_s=config.timeout,
                ),
            )
        )
    return endpoints


def _describe_plan(
    config: LoadTestConfig, endpoints: list[tuple[Target, Endpoint]], planned: int, out_dir: Path
) -> None:
    for target, endpoint in endpoints:
        print(f"target {target.name}: {endpoint.url} model={endpoint.model}")
    levels = ",".join(level_label(level) for level in config.levels)
    rate = f"{config.request_rate} req/s (burstiness {config.burstiness})" if config.request_rate else "inf"
    source = config.dataset or f"random, input ~{config.input_len} tokens" + (
        f" ({config.tokenizer} tokenizer)" if config.tokenizer else " (English words)"
    )
    print(
        f"{config.num_prompts} requests per level and target; max concurrency {levels}; request rate {rate}; "
        f"prompts: {source}; max_tokens {config.output_len}; warmup {config.warmup}; results in {out_dir}"
    )
    if planned > config.max_requests:
        print(f"WARNING: the plan has {planned} requests, --max-requests {config.max_requests} will stop it early")


def main(argv: list[str] | None = None, prog: str = "python -m loadtest") -> int:
    config = config_from_args(argv, prog)
    started_at = datetime.datetime.now()
    out_dir = Path(config.output_dir or f"results/loadtest-{started_at:%Y%m%d-%H%M%S}")
    try:
        targets = parse_targets(config.base_url, config.target, config.allow_remote)
        endpoints = _endpoints(config, targets, config.resolved_api_key())
        prompts = PromptSource(
            endpoint_kind=config.endpoint,
            input_len=config.input_len,
            output_len=config.output_len,
            seed=config.seed,
            tokenizer_path=config.tokenizer,
            dataset_path=config.dataset,
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

    state = RunState()
    _describe_plan(config, endpoints, planned_requests(config, len(endpoints)), out_dir)
    try:
        run_event_loop(run_load(config, endpoints, prompts, state))
    except KeyboardInterrupt:
        state.stopped_reason = "interrupted"

    records = [run_record(run, config) for run in state.runs]
    print(format_tables(records, state.stopped_reason) if records else "\nNo measured requests.")
    write_json(out_dir / "results.json", config, state, records, started_at)
    written = [out_dir / "results.json"]
    if records:
        from loadtest.plots import write_plots  # matplotlib import only once there is something to plot

        written += write_plots(records, out_dir)
    print("\nWrote " + ", ".join(str(path) for path in written))
    if state.stopped_reason == "interrupted":
        return 130
    return 0 if any(r["completed"] for r in records) else 1
