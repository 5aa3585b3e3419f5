"""One timed run's figures, and timed runs of transformers' two batched paths (ours: workloads.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class RunResult:
    num_seqs: int
    output_tokens: int
    seconds: float  # first request in .. last token out
    ttft: float  # mean over sequences, seconds
    decode_seconds: float  # last first-token .. last token: the pure decode phase
    steps: int = 0  # engine steps (ours only), and their split in ms per step
    host_ms: float = 0.0  # schedule + input preparation + update
    forward_ms: float = 0.0  # model forward and LM head
    sample_ms: float = 0.0

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def decode_tps(self) -> float:
        """Output tokens per second while every sequence is decoding."""
        after_first = self.output_tokens - self.num_seqs
        return after_first / self.decode_seconds if self.decode_seconds > 0 else float("nan")


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
