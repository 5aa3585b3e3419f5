"""`python -m benchmarks.stream_check_cost`: what the stream self-check costs a request.

The check keeps a choice's ids and text pieces and decodes all ids once when the choice
finishes. This streams output of 128, 1024 and 4096 tokens of the default model's tokenizer one
id per delta through `WorkerRequest.on_token_delta`, as the worker does, with the check off and
on, and times the final decode alone; the fastest of the repeats (the least disturbed by other
work on the machine), milliseconds per request. The output is English with some Chinese and
emoji (characters cut across tokens).
"""
from __future__ import annotations

import argparse
import time

from transformers import AutoTokenizer

from common.default_model import ensure_default_model
from common.messages import SamplingParams, TokenDelta
from tokenizer_worker.detokenizer import IncrementalDetokenizer
from tokenizer_worker.request_state import Choice, WorkerRequest
from tokenizer_worker.stream_check import StreamCheck
from tokenizer_worker.token_text import TokenText

SAMPLE = ("The quick brown fox jumps over the lazy dog, then writes 你好，世界 and a smile 🙂👍🏽 "
          "before it explains, step by step, how an incremental detokenizer works.\n")


def stream_request_ms(tokenizer, prompt_ids: list[int], output_ids: list[int], check: bool) -> float:
    """Milliseconds to turn `output_ids` (one per delta) into text deltas, the last one finishing."""
    token_text = TokenText(tokenizer)
    start = time.perf_counter()
    request = WorkerRequest("cost", SamplingParams(), [len(prompt_ids)])
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    choice = Choice(0, 0, "0:cost", detokenizer, stream_check=StreamCheck(detokenizer) if check else None)
    request.add_choice(choice)
    last = len(output_ids) - 1
    for i, token in enumerate(output_ids):
        delta = TokenDelta("0:cost", [token], finish_reason="length" if i == last else None)
        result = request.on_token_delta(choice, delta, token_text)
    elapsed = time.perf_counter() - start
    assert result.delta is not None and not result.delta.detokenize_mismatch
    return elapsed * 1e3


def final_decode_ms(tokenizer, prompt_ids: list[int], output_ids: list[int]) -> float:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    start = time.perf_counter()
    detokenizer.decode_at_once(output_ids)
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_check_cost", description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024, 4096], help="output tokens")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    prompt_ids = tokenizer.encode("Tell me a story.", add_special_tokens=False)
    sample_ids = tokenizer.encode(SAMPLE, add_special_tokens=False)
    print(f"{'tokens':>6} {'check off ms':>12} {'check on ms':>11} {'added ms':>8} {'added':>6} "
          f"{'final decode ms':>15}")
    for length in args.lengths:
        output_ids = (sample_ids * (length // len(sample_ids) + 1))[:length]
        off, on, decode = [], [], []
        for _ in range(args.repeats):  # alternated, so machine noise hits both sides alike
            off.append(stream_request_ms(tokenizer, prompt_ids, output_ids, check=False))
            on.append(stream_request_ms(tokenizer, prompt_ids, output_ids, check=True))
            decode.append(final_decode_ms(tokenizer, prompt_ids, output_ids))
        off_ms, on_ms = min(off), min(on)
        print(f"{length:>6} {off_ms:>12.2f} {on_ms:>11.2f} {on_ms - off_ms:>8.2f} "
              f"{(on_ms - off_ms) / off_ms:>6.1%} {min(decode):>15.3f}")


if __name__ == "__main__":
    main()
