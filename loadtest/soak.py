"""`python -m loadtest soak`: hours of mixed traffic, with the server's resources sampled.

--concurrency clients loop until --duration is over, each sending one random request after the
other (streamed, non-streamed, or aborted after its first text; chat or completions; random
prompt and output lengths; see `loadtest.soak_traffic`). Every --sample-interval seconds the
sampler reads the RSS and open file descriptors of the server and each process below it (from
/proc: the server must run on this machine) and the engine gauges of /metrics (running and
waiting requests, KV cache usage). At the end the clients finish what they sent, the server is
given time to go idle, and the report gives each figure's trend: RSS growth per hour (least
squares, after the warm-up), file descriptors first and last, KV usage back to idle, and every
request's outcome: ok, error (an answer that is an error) or lost (no answer at all).

Exit status: 0 when no request was lost or answered with an error and the server went back to
idle (no request running, KV usage 0); 1 otherwise; 2 for bad settings or an unreachable server.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from common.cli_args import add_dataclass_args, dataclass_from_args, opt
from loadtest.config import parse_pairs
from loadtest.event_loop import run_event_loop
from loadtest.process_stats import listening_pid, sample_tree
from loadtest.server_gauges import read_gauges
from loadtest.soak_report import Sample, format_sample, report, write_outputs
from loadtest.soak_traffic import KINDS, Outcome, make_request, send
from loadtest.targets import Target, check_url, first_model

IDLE_WAIT_S = 60.0  # after the last answer, for the engine gauges to return to 0


def parse_mix(text: str) -> dict[str, float]:
    """"stream=5,nonstream=3,abort=2" -> weights per kind."""
    mix = parse_pairs(text, "=", KINDS, "a number")
    if not any(w > 0 for w in mix.values()) or any(w < 0 for w in mix.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: weights must be >= 0, at least one > 0")
    return mix


@dataclass(frozen=True)
class SoakConfig:
    base_url: str = opt("http://127.0.0.1:8000/v1", "the server's OpenAI base URL")
    duration: float = opt(3600.0, "seconds of traffic")
    concurrency: int = opt(8, "clients sending one request after the other")
    mix: str = opt("stream=5,nonstream=3,abort=2", "weights of the request kinds: stream, nonstream, abort")
    input_len: int = opt(200, "prompts of 1 to this many words")
    output_len: int = opt(64, "max_tokens from 1 to this (aborted requests ask for all of it)")
    ignore_eos: bool = opt(False, "send ignore_eos=true (vLLM extension) so requests run to max_tokens",
                           action="store_true")
    sample_interval: float = opt(5.0, "seconds between samples of RSS, file descriptors and /metrics")
    server_pid: int | None = opt(None, "pid of the server process (default: the process listening on the "
                                       "base URL's port)")
    model: str | None = opt(None, "model name to send (default: the first id of GET /models)")
    timeout: float = opt(300.0, "seconds one request may take; a slower one counts as lost")
    seed: int = opt(0, "seed of the random requests")
    output_dir: str | None = opt(None, "where soak.json and soak.png go (default results/soak-DATE-TIME)")
    allow_remote: bool = opt(False, "allow a base URL whose host is not loopback (RSS and FDs are then not "
                                    "sampled unless --server-pid names a local process)", action="store_true")


@dataclass
class SoakState:
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    in_flight: int = 0
    sent: int = 0


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Soak test: mixed streamed, non-streamed and aborted requests for --duration "
                               "seconds; the server's RSS, open file descriptors, KV usage and running requests "
                               "are sampled, and their trend and every lost request reported.")
    add_dataclass_args(parser, SoakConfig, env_prefix=None)
    return parser


async def _client(http: httpx.AsyncClient, config: SoakConfig, model: str, rng: random.Random, stop_at: float,
                  state: SoakState) -> None:
    while time.monotonic() < stop_at:
        request = make_request(rng, parse_mix(config.mix), model, config.input_len, config.output_len,
                               config.ignore_eos)
        state.sent += 1
        state.in_flight += 1
        try:
            state.outcomes.append(await send(http, config.base_url, request, config.timeout))
        finally:
            state.in_flight -= 1


async def _sample(http: httpx.AsyncClient, metrics_url: str, pid: int | None, started: float,
                  state: SoakState) -> Sample:
    sample = Sample(t=time.monotonic() - started, processes=sample_tree(pid) if pid else [],
                    gauges=await read_gauges(http, metrics_url), sent=state.sent, in_flight=state.in_flight,
                    lost=sum(o.result == "lost" for o in state.outcomes),
                    errors=sum(o.result == "error" for o in state.outcomes))
    state.samples.append(sample)
    print(format_sample(sample), flush=True)
    return sample


async def run_soak(config: SoakConfig, model: str, pid: int | None, state: SoakState) -> None:
    metrics_url = config.base_url.rsplit("/v1", 1)[0] + "/metrics"
    limits = httpx.Limits(max_connections=config.concurrency + 2)
    async with httpx.AsyncClient(timeout=config.timeout, limits=limits, trust_env=False) as http:
        started = time.monotonic()
        stop_at = started + config.duration
        rng = random.Random(config.seed)
        await _sample(http, metrics_url, pid, started, state)  # before any traffic: the baseline
        clients = [asyncio.create_task(_client(http, config, model, random.Random(rng.random()), stop_at, state))
                   for _ in range(config.concurrency)]
        while not all(c.done() for c in clients):
            await asyncio.wait(clients, timeout=config.sample_interval)
            await _sample(http, metrics_url, pid, started, state)
        for client in clients:
            client.result()  # a bug in the client itself must not pass as a clean soak
        # The last aborts and finishes reach the gauges (a server without /metrics: no wait).
        idle_by = time.monotonic() + (IDLE_WAIT_S if any(s.gauges for s in state.samples) else 0.0)
        while True:
            sample = await _sample(http, metrics_url, pid, started, state)
            if sample.is_idle() or time.monotonic() >= idle_by:
                break
            await asyncio.sleep(min(config.sample_interval, 1.0))


def main(argv: list[str] | None = None, prog: str = "python -m loadtest soak") -> int:
    parser = build_parser(prog)
    config = dataclass_from_args(SoakConfig, parser.parse_args(argv))
    if config.duration <= 0 or config.concurrency < 1 or config.sample_interval <= 0 or config.timeout <= 0:
        parser.error("--duration, --concurrency, --sample-interval and --timeout must be > 0")
    if config.input_len < 1 or config.output_len < 1:
        parser.error("--input-len and --output-len must be >= 1")
    try:
        parse_mix(config.mix)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--mix {exc}")
    try:
        base_url = check_url(config.base_url, config.allow_remote)
        config = dataclasses.replace(config, base_url=base_url)
        model = config.model or first_model(Target("server", base_url), None, timeout_s=30.0)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pid = config.server_pid or listening_pid(urlsplit(base_url).port or 80)
    if pid is None:
        print("warning: no local process listens on the server's port: RSS and file descriptors are not sampled",
              file=sys.stderr)
    out_dir = Path(config.output_dir or f"results/soak-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"soak: {base_url} model={model} for {config.duration:g} s, {config.concurrency} clients, mix "
          f"{config.mix}, sampling every {config.sample_interval:g} s (server pid {pid}); results in {out_dir}")
    state = SoakState()
    try:
        run_event_loop(run_soak(config, model, pid, state))
    except KeyboardInterrupt:
        print("interrupted: the report covers what ran so far", file=sys.stderr)
    summary = report(state.samples, state.outcomes, config.duration)
    print(summary.text)
    write_outputs(out_dir, config, state.samples, state.outcomes, summary)
    print(f"\nWrote {out_dir / 'soak.json'}, {out_dir / 'soak.png'}")
    return 0 if summary.clean else 1
