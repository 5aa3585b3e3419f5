"""The runner's side of request traces: which requests are traced, and what each step records.

A request that asks (`SamplingParams.trace`) is followed from its first schedule until its first
decode step has been recorded (or it finishes); then it costs nothing more. Two of its steps are
recorded in full, every operator hooked (`recorder.py`): the step that completes its prompt (a
chunked prefill's last chunk; the chunks before it are summarised, without hooks) and its first
decode step. Each record leaves the runner in `RunnerOutput.traces` as an `EngineTrace` holding
that one step. A step with no traced request pays one check of an empty dict.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Literal

import torch

from common.messages import EngineTrace, TraceChunk, TraceStep, TraceStop
from engine.attention.base import AttentionBackend, StepInputs
from engine.models.llama import CausalLM
from engine.runner.model_inputs import ModelInputs
from engine.trace.recorder import MODEL_LEVEL, StepRecording, stops_of_modules
from engine.trace.stops import RequestRows, model_stops

Phase = Literal["chunk", "prefill", "decode"]


@dataclass
class _Followed:
    """A traced request until its trace is complete."""

    num_prompt_tokens: int
    prefill_recorded: bool = False
    chunks: list[TraceChunk] = field(default_factory=list)  # earlier prefill chunks, for the prefill record


@dataclass(frozen=True)
class _InStep:
    """A traced request in this step."""

    request_id: str
    phase: Phase
    query_start: int
    rows: RequestRows
    batch_invariant: bool


class RequestTracer:
    def __init__(self, model: CausalLM, backend: AttentionBackend, device: torch.device):
        self.model = model
        self.backend = backend
        self.device = device
        self.followed: dict[str, _Followed] = {}
        self.completed: set[str] = set()  # recorded in full, still running (a preemption must not restart it)
        self._stops = stops_of_modules(model)
        self.dtype = str(model.embed_tokens.weight.dtype).removeprefix("torch.")

    @property
    def tracking(self) -> bool:
        return bool(self.followed or self.completed)

    def follow(self, request_id: str, num_prompt_tokens: int) -> None:
        """A traced request got a row (again, after a preemption: its progress is kept)."""
        if request_id not in self.completed:
            self.followed.setdefault(request_id, _Followed(num_prompt_tokens))

    def forget(self, request_id: str) -> None:
        """It finished (or was aborted)."""
        self.followed.pop(request_id, None)
        self.completed.discard(request_id)

    def begin(self, inputs: ModelInputs, start: float) -> StepTrace | None:
        """The step's trace if it holds a followed request at a step worth recording. `inputs`
        are the runner's ModelInputs; `start` when the runner's step began (perf_counter)."""
        step = inputs.attention
        in_step = [entry for i, request_id in enumerate(inputs.request_ids) if request_id in self.followed
                   and (entry := self._entry(inputs, step, i)) is not None]
        if not in_step:
            return None
        full = any(entry.phase != "chunk" for entry in in_step)
        recording = StepRecording(self._stops, self.backend, self.device) if full else None
        return StepTrace(self, in_step, step, recording, start)

    def _entry(self, inputs: ModelInputs, step: StepInputs, i: int) -> _InStep | None:
        request_id = inputs.request_ids[i]
        followed = self.followed[request_id]
        qsl = step.query_start_loc_np
        cached, context = int(step.num_computed_tokens_np[i]), int(step.seq_lens_np[i])
        logits_rows = 0
        if request_id in inputs.sampled_request_ids:
            k = inputs.sampled_request_ids.index(request_id)
            logits_rows = 1 if inputs.num_logits is None else int(inputs.num_logits[k])
        phase: Phase
        if cached >= followed.num_prompt_tokens:
            phase = "decode"
        elif followed.prefill_recorded:
            return None  # recomputed after a preemption: recorded already
        else:
            phase = "prefill" if logits_rows else "chunk"
        invariant = step.batch_invariant_np is not None and bool(step.batch_invariant_np[i])
        return _InStep(request_id, phase, int(qsl[i]), RequestRows(int(qsl[i + 1] - qsl[i]), logits_rows, cached,
                                                                   context), invariant)


class StepTrace:
    """One step with traced requests: its hooks while the model runs (`with`), laps of the
    runner's phases (`lap`), then the records (`finish`)."""

    def __init__(self, tracer: RequestTracer, in_step: list[_InStep], step: StepInputs,
                 recording: StepRecording | None, start: float):
        self.tracer = tracer
        self.in_step = in_step
        self.step = step
        self.recording = recording
        self.start = start
        self.laps: dict[str, float] = {}
        self._last = self._now()
        self.laps["prepare"] = self._last - start
        self._hooks = contextlib.ExitStack()

    def _now(self) -> float:
        if self.tracer.device.type == "cuda":
            torch.cuda.synchronize(self.tracer.device)
        return time.perf_counter()

    def __enter__(self) -> StepTrace:
        if self.recording is not None:
            self._hooks.enter_context(self.recording.installed())
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.close()

    def lap(self, name: str) -> None:
        """The runner finished `name` (forward, logits, sample) since the previous lap."""
        now = self._now()
        self.laps[name] = now - self._last
        self._last = now

    def finish(self) -> dict[str, EngineTrace] | None:
        """Per traced request recorded in full this step, its EngineTrace; summaries of earlier
        prefill chunks stay with the tracer until their prompt's last chunk."""
        runner_s = self._now() - self.start
        records: dict[str, EngineTrace] = {}
        for entry in self.in_step:
            followed = self.tracer.followed[entry.request_id]
            if entry.phase == "chunk":
                followed.chunks.append(TraceChunk(entry.rows.tokens, entry.rows.context_tokens,
                                                  self.step.num_tokens, self.step.num_reqs, _ms(runner_s)))
                continue
            record = self._step_record(entry, runner_s)
            trace = EngineTrace(device=str(self.tracer.device), dtype=self.tracer.dtype,
                                attention_backend=self.tracer.backend.name,
                                linear_method=self.tracer.model.lm_head.method.name,
                                batch_invariant=entry.batch_invariant)
            if entry.phase == "prefill":
                record.earlier_chunks, followed.chunks = followed.chunks, []
                followed.prefill_recorded = True
                trace.prefill = record
            else:
                trace.decode = record
                del self.tracer.followed[entry.request_id]  # complete: no more cost for it
                self.tracer.completed.add(entry.request_id)
            records[entry.request_id] = trace
        return records or None

    def _step_record(self, entry: _InStep, runner_s: float) -> TraceStep:
        assert self.recording is not None
        rec, model, rows = self.recording, self.tracer.model, entry.rows
        stops = model_stops(rec, model, rows)
        lm_head = rec.time_of(MODEL_LEVEL, "lm_head")
        logits = self.laps.get("logits", 0.0)
        if model.embed_tokens.weight.dtype != torch.float32 and lm_head is not None:
            stops.append(TraceStop("logits_refine", [1, rows.logits_rows, model.arch.vocab_size],
                                   [1, rows.logits_rows, model.arch.vocab_size], _ms(max(0.0, logits - lm_head)),
                                   note="the best candidates' logits again with float32 accumulation "
                                        "(bfloat16 / float16 only); time: the logits minus lm_head"))
        stops.append(TraceStop("sampling", [rows.logits_rows, model.arch.vocab_size], [rows.logits_rows],
                               _ms(self.laps.get("sample", 0.0)), note="logits -> token id (penalties, "
                               "temperature, top-k/p, min-p, draw; greedy: argmax)"))
        describe = getattr(self.tracer.backend, "describe_kernel", None)
        kernel = describe(rec.attention_metadata, entry.query_start) \
            if describe is not None and rec.attention_metadata is not None else ""
        return TraceStep(phase="prefill" if entry.phase == "prefill" else "decode", tokens=rows.tokens,
                         cached_tokens=rows.cached_tokens, context_tokens=rows.context_tokens,
                         batch_tokens=self.step.num_tokens, batch_requests=self.step.num_reqs,
                         attention_kernel=kernel, prepare_ms=_ms(self.laps["prepare"]),
                         forward_ms=_ms(self.laps.get("forward", 0.0)), logits_ms=_ms(logits),
                         sample_ms=_ms(self.laps.get("sample", 0.0)), runner_ms=_ms(runner_s), stops=stops)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)
