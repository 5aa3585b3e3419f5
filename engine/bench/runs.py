"""One timed generation run per system: our engine, and transformers' two batched paths."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.llm_engine import LLMEngine
from common.messages import SamplingParams


@dataclass
class RunResult:
    num_seqs: int
    output_tokens: int
    seconds: float  # first request in .. last token out
    ttft: float  # mean over sequences, seconds
    decode_seconds: float  # last first-token .. last token: the pure decode phase

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def decode_tps(self) -> float:
        """Output tokens per second while every sequence is decoding."""
        after_first = self.output_tokens - self.num_seqs
        return after_first / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def run_ours(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> RunResult:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    engine.block_manager.reset_prefix_cache()  # every round starts cold, like transformers
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"bench-{i}", p, params)
    first: dict[str, float] = {}
    tokens = 0
    while engine.has_unfinished():
        deltas = engine.step()
        now = time.perf_counter()
        for d in deltas:
            first.setdefault(d.request_id, now)
            tokens += len(d.new_token_ids)
    end = time.perf_counter()
    return RunResult(len(prompts), tokens, end - start, sum(t - start for t in first.values()) / len(first),
                     end - max(first.values()))


class _TimingStreamer:
    """transformers streamer protocol: put() is called with the prompt, then each new token."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


@torch.inference_mode()
def run_hf_generate(model, prompts: list[list[int]], output_len: int) -> RunResult:
    """Batched `generate` (static batch, same-length prompts so no padding differences)."""
    ids = torch.tensor(prompts)
    streamer = _TimingStreamer()
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_len,
                         min_new_tokens=output_len, do_sample=False, streamer=streamer, pad_token_id=0)
    end = time.perf_counter()
    first = streamer.times[1]  # [0] is the prompt
    tokens = (out.shape[1] - ids.shape[1]) * len(prompts)
    return RunResult(len(prompts), tokens, end - start, first - start, end - first)


@torch.inference_mode()
def run_hf_generate_batch(model, prompts: list[list[int]], output_len: int) -> RunResult:
    """transformers' continuous-batching `generate_batch`."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    outs = model.generate_batch(prompts, generation_config=config, record_timestamps=True)
    end = time.perf_counter()
    tokens = sum(len(o.generated_tokens) for o in outs.values())
    firsts = [o.timestamps[0] for o in outs.values() if o.timestamps]  # perf_counter stamps
    ttft = sum(t - start for t in firsts) / len(firsts) if firsts else float("nan")
    last_first = max(firsts) if firsts else start
    return RunResult(len(prompts), tokens, end - start, ttft, end - last_first)
