"""Runs the load: warmup, then each sweep level in rounds that alternate over the targets.

Order for two targets A, B and rounds=2 at each level: A round 1, B round 1, A round 2, B round 2,
so drift of a shared, noisy machine lands on every target alike. Every target gets the same
requests (same prompts, same arrival times), and each level gets fresh prompts so a prefix
cache cannot serve one level from the previous one. Results accumulate in a RunState as they
arrive, so a run stopped by Ctrl-C or a hard cap still leaves everything measured so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from tqdm import tqdm

from loadtest.client import Endpoint, new_session, send_request
from loadtest.config import LoadTestConfig
from loadtest.prompts import PromptSource
from loadtest.request import RequestResult, RequestSpec
from loadtest.targets import Target


@dataclass
class LevelRun:
    """All measured requests of one target at one sweep level, over all its rounds."""

    target: Target
    endpoint: Endpoint
    max_concurrency: int | None  # None: no cap, arrivals only (--request-rate)
    results: list[RequestResult] = field(default_factory=list)
    duration_s: float = 0.0  # summed wall time of this target's rounds
    aborted: int = 0  # requests in flight when the run was stopped; not in results


@dataclass
class RunState:
    runs: list[LevelRun] = field(default_factory=list)
    stopped_reason: str | None = None  # None (ran to the end), "interrupted", "max_duration", "max_requests"
    requests_sent: int = 0


def level_label(max_concurrency: int | None) -> str:
    return "inf" if max_concurrency is None else str(max_concurrency)


def split_rounds(num_requests: int, rounds: int, max_concurrency: int | None) -> list[int]:
    """Round sizes: nearly equal, and each at least max_concurrency so a round can fill the cap."""
    if max_concurrency is not None:
        rounds = min(rounds, max(1, num_requests // max_concurrency))
    rounds = max(1, min(rounds, num_requests))
    base, extra = divmod(num_requests, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def arrival_offsets(num_requests: int, rate: float | None, burstiness: float, rng: np.random.Generator) -> list[float]:
    """Send times from the round's start. Gamma gaps with mean 1/rate, as vllm bench serve draws them."""
    if rate is None:
        return [0.0] * num_requests
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests)
    gaps[0] = 0.0  # the first request goes out at once
    return np.cumsum(gaps).tolist()


def planned_requests(config: LoadTestConfig, num_targets: int) -> int:
    return (config.warmup + config.num_prompts * len(config.levels)) * num_targets


class Runner:
    def __init__(
        self,
        config: LoadTestConfig,
        endpoints: list[tuple[Target, Endpoint]],
        prompts: PromptSource,
        state: RunState,
    ) -> None:
        self.config = config
        self.endpoints = endpoints
        self.prompts = prompts
        self.state = state
        self._rng = np.random.default_rng(config.seed)
        self._bar: tqdm | None = None

    async def run(self) -> None:
        levels = self.config.levels
        total = min(planned_requests(self.config, len(self.endpoints)), self.config.max_requests)
        async with new_session(self.config.timeout) as http:
            with tqdm(total=total, unit="req", dynamic_ncols=True) as self._bar:
                await self._warmup(http, levels[0])
                for level in levels:
                    await self._level(http, level)
                    if self.state.stopped_reason:
                        return

    async def _warmup(self, http: aiohttp.ClientSession, first_level: int | None) -> None:
        if self.config.warmup == 0:
            return
        specs = self.prompts.take(self.config.warmup)
        offsets = [0.0] * len(specs)
        for target, endpoint in self.endpoints:
            throwaway = LevelRun(target, endpoint, first_level)
            self._describe(f"{target.name} warmup")
            await self._round(http, specs, offsets, throwaway)
            if throwaway.results and not any(r.success for r in throwaway.results):
                first = throwaway.results[0]
                example = f"{first.error_kind}: {first.error_message[:200]}"
                tqdm.write(f"WARNING: every warmup request to {target.name} failed, e.g. {example}")
            if self.state.stopped_reason:
                return

    async def _level(self, http: aiohttp.ClientSession, level: int | None) -> None:
        specs = self.prompts.take(self.config.num_prompts)
        runs = [LevelRun(target, endpoint, level) for target, endpoint in self.endpoints]
        self.state.runs.extend(runs)
        rounds = self.config.rounds if len(self.endpoints) > 1 else 1
        start = 0
        for size in split_rounds(len(specs), rounds, level):
            round_specs = specs[start : start + size]
            start += size
            offsets = arrival_offsets(size, self.config.request_rate, self.config.burstiness, self._rng)
            for run in runs:
                self._describe(f"{run.target.name} c={level_label(level)}")
                await self._round(http, round_specs, offsets, run)
                if self.state.stopped_reason:
                    return

    async def _round(
        self, http: aiohttp.ClientSession, specs: list[RequestSpec], offsets: list[float], run: LevelRun
    ) -> None:
        """Send specs at their offsets with at most run.max_concurrency in flight; wait for all."""
        cap = asyncio.Semaphore(run.max_concurrency) if run.max_concurrency is not None else None
        in_flight = 0
        start = time.perf_counter()

        async def one(spec: RequestSpec, offset: float) -> None:
            nonlocal in_flight
            delay = offset - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            async with cap if cap is not None else contextlib.nullcontext():
                if not self._take_request():
                    return
                in_flight += 1
                result = await send_request(http, run.endpoint, spec)
                in_flight -= 1
            run.results.append(result)
            assert self._bar is not None, "the progress bar lives for the whole run"
            self._bar.update(1)

        tasks = [asyncio.create_task(one(spec, offset)) for spec, offset in zip(specs, offsets, strict=True)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            # Ctrl-C or --max-duration cancelled us: stop the requests still running, count them.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            run.aborted += in_flight
            raise
        finally:
            run.duration_s += time.perf_counter() - start

    def _take_request(self) -> bool:
        if self.state.requests_sent >= self.config.max_requests:
            self.state.stopped_reason = "max_requests"
            return False
        self.state.requests_sent += 1
        return True

    def _describe(self, text: str) -> None:
        assert self._bar is not None, "the progress bar lives for the whole run"
        self._bar.set_description(text)


async def run_load(
    config: LoadTestConfig, endpoints: list[tuple[Target, Endpoint]], prompts: PromptSource, state: RunState
) -> None:
    """Run everything within --max-duration; on Ctrl-C the cancellation propagates to the caller."""
    try:
        async with asyncio.timeout(config.max_duration):
            await Runner(config, endpoints, prompts, state).run()
    except TimeoutError:
        state.stopped_reason = "max_duration"
