"""The load test's settings: one frozen dataclass, and the argparse parser generated from it.

Each field is an `opt(...)` of `common.cli_args` (the server's generator): its help text and,
where the annotation does not say, the function that turns the command-line string into the
field's value, so a new option is one new field. No environment variables: a load test is
configured on its command line. Cross-field rules live in validate().
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from common.cli_args import add_dataclass_args, dataclass_from_args, opt
from loadtest.metrics import SLO_KEYS


def parse_levels(text: str) -> tuple[int, ...]:
    """Parse "1,4,16,64" into (1, 4, 16, 64); each level is a max number of requests in flight."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each concurrency level must be >= 1")
    return levels


def parse_pairs(text: str, sep: str, keys, what: str) -> dict[str, float]:
    """"a<sep>1,b<sep>2" -> {"a": 1.0, "b": 2.0}, keys from `keys`; `what` names a value in errors."""
    pairs: dict[str, float] = {}
    for part in text.split(","):
        key, found, value = part.strip().partition(sep)
        if not found or key not in keys:
            raise argparse.ArgumentTypeError(f"{part!r}: expected KEY{sep}VALUE with KEY in {', '.join(keys)}")
        try:
            pairs[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: {value!r} is not {what}") from None
    return pairs


def parse_slo(text: str) -> dict[str, float]:
    """Parse "ttft:500,tpot:50" into {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slo = parse_pairs(text, ":", SLO_KEYS, "a number of milliseconds")
    for key, value in slo.items():
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{key}:{value:g}: an SLO must be > 0 ms")
    return slo


@dataclass(frozen=True)
class LoadTestConfig:
    base_url: str | None = opt(None, "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    target: tuple[str, ...] = opt(
        (),
        "compare mode: NAME=URL, repeat for each server; figures are also given as ratios to the first",
        parse=str,
        action="append",
        metavar="NAME=URL",
    )
    model: str | None = opt(None, "model name to send (default: first id from GET /models of each target)")
    endpoint: str = opt("chat", "API to load: /chat/completions or /completions", choices=("chat", "completions"))
    num_prompts: int = opt(64, "requests measured per concurrency level and target")
    concurrency: tuple[int, ...] | None = opt(
        None,
        "comma-separated sweep of max requests in flight (default 1,4,16,64; unbounded with --request-rate)",
        parse=parse_levels,
    )
    request_rate: float | None = opt(None, "requests per second arriving as a Poisson/gamma process")
    burstiness: float = opt(1.0, "gamma shape of the arrivals: 1 = Poisson, <1 burstier, >1 more even")
    rounds: int = opt(2, "compare mode: split each level into this many alternating rounds A,B,A,B,...")
    input_len: int = opt(256, "random prompts: about this many tokens")
    output_len: int = opt(128, "max_tokens of each request (a dataset line may set its own)")
    tokenizer: str | None = opt(None, "local Hugging Face tokenizer folder to size random prompts in real tokens")
    dataset: str | None = opt(None, 'JSONL file, one {"prompt": ...} or {"messages": [...]} per line '
                                    '(optionally its own "max_tokens" and "model")')
    ignore_eos: bool = opt(False, "send ignore_eos=true (vLLM extension) so every request runs to max_tokens",
                            action="store_true")
    temperature: float = opt(0.0, "sampling temperature sent with every request")
    top_p: float | None = opt(None, "top_p sent with every request (default: not sent)")
    api_key: str | None = opt(None, "bearer token (default: $OPENAI_API_KEY if set)")
    seed: int = opt(0, "seed of the random prompts and arrival times")
    warmup: int = opt(1, "requests per target sent and discarded before measuring")
    timeout: float = opt(600.0, "seconds one request may take in all")
    max_requests: int = opt(10000, "hard cap on requests sent in the whole run, warmup included")
    max_duration: float = opt(3600.0, "hard cap on the run's wall time in seconds")
    slo: dict[str, float] | None = opt(
        None, "goodput SLOs in ms, e.g. ttft:500,tpot:50 (keys: ttft, tpot, e2el)", parse=parse_slo
    )
    output_dir: str | None = opt(None, "where results.json and the plots go (default results/loadtest-DATE-TIME)")
    allow_remote: bool = opt(False, "allow base URLs whose host is not loopback", action="store_true")

    @property
    def levels(self) -> tuple[int | None, ...]:
        """Sweep levels; None means no cap on requests in flight (arrival rate only)."""
        if self.concurrency is not None:
            return self.concurrency
        return (None,) if self.request_rate is not None else (1, 4, 16, 64)

    def resolved_api_key(self) -> str | None:
        return self.api_key if self.api_key is not None else os.environ.get("OPENAI_API_KEY") or None

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        positive_ints = ("num_prompts", "rounds", "input_len", "output_len", "max_requests")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.warmup < 0:
            raise ValueError("--warmup must be >= 0")
        for name in ("burstiness", "timeout", "max_duration"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError("--request-rate must be > 0")
        if self.temperature < 0:
            raise ValueError("--temperature must be >= 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError("--top-p must be in (0, 1]")


def build_parser(prog: str = "python -m loadtest") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Load generator for OpenAI-compatible servers (streaming, vLLM benchmark metrics).",
    )
    add_dataclass_args(parser, LoadTestConfig, env_prefix=None)
    return parser


def config_from_args(argv: list[str] | None = None, prog: str = "python -m loadtest") -> LoadTestConfig:
    parser = build_parser(prog)
    config = dataclass_from_args(LoadTestConfig, parser.parse_args(argv))
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    return config
