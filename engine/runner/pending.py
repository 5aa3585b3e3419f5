"""A step's sampled ids on their way to the host: what `ModelRunner.execute_async` returns.

On CUDA the ids (and the logprobs, when asked) are copied into pinned host memory behind the
step's kernels, and an event marks the end of the copies; `result()` waits for that event alone.
So the host can schedule and launch the next step while this one runs (async scheduling), and
reads this one's ids once they are there. Each step copies into its own pinned tensors (the
caching host allocator reuses them once their copy is done), so a later step never overwrites
ids that are not read yet. On CPU the step has already run and `result()` only converts.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.core.outputs import PromptLogprobsChunk, RunnerOutput


class ReadyStep:
    """A step whose output the host already has (drafts verified, a traced step, no samples)."""

    def __init__(self, result: RunnerOutput):
        self._result = result

    def result(self) -> RunnerOutput:
        return self._result

    def attach_prompt_logprobs(self, chunks: dict[str, PromptLogprobsChunk]) -> None:
        self._result.prompt_logprobs = chunks


class PendingStep:
    def __init__(self, request_ids: list[str], token_ids: torch.Tensor, num_logprobs: np.ndarray,
                 logprob_token_ids: torch.Tensor | None, logprobs: torch.Tensor | None):
        """token_ids: [rows] one sampled id per request; num_logprobs: [rows] how many top
        logprobs each asked for (-1: none); logprob_token_ids / logprobs: [rows, 1 + k] or None."""
        self.request_ids = request_ids
        self.num_logprobs = num_logprobs
        self._event: torch.cuda.Event | None = None
        self._resolved: RunnerOutput | None = None
        if token_ids.is_cuda:
            token_ids = _to_pinned(token_ids)
            logprob_token_ids = None if logprob_token_ids is None else _to_pinned(logprob_token_ids)
            logprobs = None if logprobs is None else _to_pinned(logprobs)
            self._event = torch.cuda.Event()
            self._event.record()
        self._token_ids = token_ids
        self._logprob_token_ids, self._logprobs = logprob_token_ids, logprobs
        self._prompt_logprobs: dict[str, PromptLogprobsChunk] | None = None
        if self._event is None:
            self.result()  # on CPU: read now, whatever later steps do with the sampler's buffers

    def result(self) -> RunnerOutput:
        if self._resolved is not None:
            return self._resolved
        if self._event is not None:
            self._event.synchronize()
        assert self._token_ids is not None
        result = RunnerOutput(self.request_ids, [[t] for t in self._token_ids.tolist()])
        if self._logprobs is not None:
            assert self._logprob_token_ids is not None
            add_logprobs(result, self._logprob_token_ids.tolist(), self._logprobs.tolist(),
                         self.num_logprobs.tolist(), list(range(len(self.request_ids))))
        result.prompt_logprobs = self._prompt_logprobs
        self._resolved = result
        return result

    def attach_prompt_logprobs(self, chunks: dict[str, PromptLogprobsChunk]) -> None:
        """Host lists already (computing them read the device), delivered with the sampled ids."""
        self._prompt_logprobs = chunks
        if self._resolved is not None:
            self._resolved.prompt_logprobs = chunks


def add_logprobs(result: RunnerOutput, ids: list[list[int]], values: list[list[float]], wanted: list[int],
                 first_rows: list[int]) -> None:
    """Per request and output token: [sampled id, top ids...] and their logprobs. ids / values:
    [logits rows][1 + k]; a request's tokens are the rows from its first one."""
    result.logprob_token_ids, result.logprobs = [], []
    for first, tokens in zip(first_rows, result.sampled_token_ids, strict=True):
        n = wanted[first]
        rows = range(first, first + len(tokens))
        result.logprob_token_ids.append(None if n < 0 else [ids[r][: n + 1] for r in rows])
        result.logprobs.append(None if n < 0 else [values[r][: n + 1] for r in rows])


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of device tensor `t`, filled behind the work queued before it."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
