"""Where an engine step's time goes: the model's forward (LM head included), the sampler, and the
host work around them (schedule, input preparation, update).

It times the step from outside: the model's `forward` and `compute_logits` and the runner's
sampler's `__call__` are wrapped (on their classes, found through the engine instance) for the
duration of a run, and host time is the step's wall time minus theirs. On CPU every op is
synchronous, so the split is exact; on CUDA the step's final `.tolist()` absorbs the queued
kernels. Only names that every version of the engine has are used, so `benchmarks.commits`
can time an older checkout with the same code.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class StepTimes:
    steps: int = 0
    step_s: float = 0.0
    forward_s: float = 0.0  # model forward + LM head
    sample_s: float = 0.0
    per_step_host_s: list[float] = field(default_factory=list)

    @property
    def host_s(self) -> float:
        return self.step_s - self.forward_s - self.sample_s

    def ms_per_step(self, seconds: float) -> float:
        return 1e3 * seconds / max(self.steps, 1)


@contextlib.contextmanager
def timed_engine(engine, times: StepTimes) -> Iterator[StepTimes]:
    """Wrap the model's forward, its LM head and the sampler so that their time adds to `times`."""
    model_cls, sampler_cls = type(engine.model), type(engine.runner.sampler)
    wrapped = [(model_cls, "forward", "forward_s"), (model_cls, "compute_logits", "forward_s"),
               (sampler_cls, "__call__", "sample_s")]
    originals = []
    for cls, name, slot in wrapped:
        original = getattr(cls, name)
        originals.append((cls, name, original))

        def timed(*args, __original=original, __slot=slot, **kwargs):
            start = time.perf_counter()
            try:
                return __original(*args, **kwargs)
            finally:
                setattr(times, __slot, getattr(times, __slot) + time.perf_counter() - start)

        setattr(cls, name, timed)
    try:
        yield times
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def timed_step(engine, times: StepTimes) -> list:
    """One `engine.step()`, its wall time and host share added to `times`."""
    forward, sample = times.forward_s, times.sample_s
    start = time.perf_counter()
    deltas = engine.step()
    elapsed = time.perf_counter() - start
    times.steps += 1
    times.step_s += elapsed
    times.per_step_host_s.append(elapsed - (times.forward_s - forward) - (times.sample_s - sample))
    return deltas
