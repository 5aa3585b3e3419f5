"""One server request inside the tokenizer worker: its choices, their detokenizers, its usage.

A request runs len(prompts) * n choices, each an engine request of its own (child id from
`common.parallel_sampling`). Token deltas come in per child; text deltas go out per choice. A
traced request also collects its trace here (`tokenizer_worker.trace`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from common.messages import SamplingParams, TextDelta, TokenDelta, Usage
from tokenizer_worker.detokenizer import IncrementalDetokenizer
from tokenizer_worker.prompt_echo import prompt_echo
from tokenizer_worker.stream_check import StreamCheck
from tokenizer_worker.token_text import TokenText
from tokenizer_worker.trace import TRACED_CHOICE, RequestTraceBuilder


@dataclass
class Choice:
    index: int
    prompt_index: int
    child_id: str
    detokenizer: IncrementalDetokenizer
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # the engine sends it on the first delta only
    finished: bool = False
    stream_check: StreamCheck | None = None  # None: the self-check is off
    # echo / prompt_logprobs: the prompt as the request gave it and its ids, until the first delta
    prompt: str | list[int] | None = None
    prompt_ids: list[int] | None = None


@dataclass
class DeltaResult:
    delta: TextDelta | None  # None when there is nothing to send yet (text held back)
    abort_in_engine: bool  # a stop string ended a choice the engine is still running


@dataclass
class WorkerRequest:
    request_id: str
    params: SamplingParams
    prompt_lens: list[int]  # per prompt
    choices: dict[str, Choice] = field(default_factory=dict)  # by child id
    num_unfinished: int = 0
    trace: RequestTraceBuilder | None = None  # "trace": true

    def add_choice(self, choice: Choice) -> None:
        self.choices[choice.child_id] = choice
        self.num_unfinished += 1

    def on_token_delta(self, choice: Choice, d: TokenDelta, token_text: TokenText, tokenizer=None) -> DeltaResult:
        assert not choice.finished, f"delta for finished choice {choice.child_id}"
        choice.num_output_tokens += len(d.new_token_ids)
        if d.num_cached_tokens is not None:
            choice.num_cached_tokens = d.num_cached_tokens
        traced = self.trace is not None and choice.index == TRACED_CHOICE
        if traced and d.trace is not None:
            self.trace.on_engine(d.trace)
        text_ids = d.new_token_ids
        if d.stop_reason is not None and not self.params.include_stop_str_in_output:
            text_ids = text_ids[:-1]  # a stop token id ends the text without being part of it (vLLM)
        start = time.perf_counter() if traced else 0.0
        out = choice.detokenizer.add_tokens(text_ids)
        text, finish, stop_reason, abort = out.text, None, None, False
        if out.stop_hit is not None:
            finish, stop_reason = "stop", out.stop_hit
            abort = d.finish_reason is None
        elif d.finish_reason is not None:
            text += choice.detokenizer.flush()
            if choice.detokenizer.stop_hit is not None:  # the tail held back completed a stop string
                finish, stop_reason = "stop", choice.detokenizer.stop_hit
            else:
                finish, stop_reason = d.finish_reason, d.stop_reason
        if traced:
            self.trace.on_detokenized(d.trace, len(text_ids), text, round((time.perf_counter() - start) * 1e3, 4))
        if choice.stream_check is not None:
            choice.stream_check.record(text_ids, text)
        logprobs = token_text.logprobs(d.logprobs) if d.logprobs else None
        echo = None
        if choice.prompt is not None and d.finish_reason != "error":
            assert choice.prompt_ids is not None
            echo = prompt_echo(choice.prompt, choice.prompt_ids, d, tokenizer, token_text)
            choice.prompt = choice.prompt_ids = None
        if finish is None and not text and not logprobs and echo is None:
            return DeltaResult(None, False)
        delta = TextDelta(self.request_id, choice.index, text, len(d.new_token_ids), finish, stop_reason,
                          logprobs, error=d.error, prompt=echo)
        if finish is not None:
            choice.finished = True
            if choice.stream_check is not None:
                delta.detokenize_mismatch = not choice.stream_check.matches(self.request_id, choice.index)
                choice.stream_check = None  # its ids and text are not needed any more
            self.num_unfinished -= 1
            if self.num_unfinished == 0:
                delta.usage = self.usage()
                if self.trace is not None:
                    delta.trace = self.trace.build()
        return DeltaResult(delta, abort)

    def unfinished_child_ids(self) -> list[str]:
        return [c.child_id for c in self.choices.values() if not c.finished]

    def usage(self) -> Usage:
        # Each prompt counts once however many choices it has (OpenAI's usage for n > 1).
        cached = [0] * len(self.prompt_lens)
        for c in self.choices.values():
            cached[c.prompt_index] = max(cached[c.prompt_index], c.num_cached_tokens)
        return Usage(prompt_tokens=sum(self.prompt_lens),
                     completion_tokens=sum(c.num_output_tokens for c in self.choices.values()),
                     cached_tokens=sum(cached))
