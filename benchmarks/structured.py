"""Benchmark: JSON-schema-constrained decoding against the same workload without a schema.

    python -m benchmarks --structured [--dtype bfloat16] [--rounds 3] [--batch 32]

Workload: `--batch` chat requests at once ("list people as JSON"), --output-len tokens each,
greedy. Constrained, every row follows a JSON schema (an array of at least 50 person objects
with an enum, an integer range, a bounded string and a nested object), so no grammar can end
before max_tokens and both sides generate the same number of tokens; unconstrained, EOS is
ignored. Rounds alternate between the two; figures are the best round. The mask time per step
is what structured outputs add to a step: filling the bitmask of every constrained row
(scheduler), applying it to the logits (runner) and advancing the matchers with the sampled
tokens; it is timed by wrapping those three calls.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import engine.runner.model_runner as model_runner
from common.engine_config import EngineConfig
from common.messages import SamplingParams
from common.structured_outputs import json_schema_spec
from engine.llm_engine import LLMEngine
from engine.structured.manager import StructuredOutputManager

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["engineer", "doctor", "teacher", "artist"]},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}},
    "required": ["name", "age", "role", "address"]}
SCHEMA = {"type": "array", "items": PERSON, "minItems": 50}
QUESTION = "List people as JSON: name, age, role, and their address. Person number {i}:"


class MaskTimer:
    """Seconds spent in the structured-outputs calls of a step, by wrapping them in place."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner, name: str, static: bool = False) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(owner, name, staticmethod(timed) if static else timed)
        self._undo.append(lambda: setattr(owner, name, staticmethod(original) if static else original))

    def __enter__(self) -> MaskTimer:
        self.wrap(StructuredOutputManager, "fill_bitmask")
        self.wrap(StructuredOutputManager, "accept", static=True)
        self.wrap(model_runner, "apply_grammar_bitmask")
        return self

    def __exit__(self, *exc) -> None:
        for undo in reversed(self._undo):
            undo()


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, int]:
    """(seconds, output tokens, steps) for all prompts at once, to their end."""
    engine.scheduler.reset_prefix_cache()
    tokens = steps = 0
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    while engine.has_unfinished():
        tokens += sum(len(d.new_token_ids) for d in engine.step())
        steps += 1
    return time.perf_counter() - start, tokens, steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args(argv)
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, device=args.device, max_model_len=1024,
                                    max_num_seqs=args.batch, kv_cache_memory=512 << 20))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(engine.model_dir))
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTION.format(i=i)}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
               for i in range(args.batch)]
    sides = {"plain": SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True),
             "json schema": SamplingParams(temperature=0, max_tokens=args.output_len,
                                           structured_outputs=json_schema_spec(SCHEMA, "bench"))}
    run(engine, prompts[:2], sides["json schema"])  # warm-up: compiles the grammar, both paths
    run(engine, prompts[:2], sides["plain"])
    best: dict[str, tuple[float, float]] = {}  # side -> (tok/s, mask ms per step) of its best round
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for side, params in sides.items():
            with MaskTimer() as mask:
                seconds, tokens, steps = run(engine, prompts, params)
            assert tokens == args.batch * args.output_len, f"{side}: {tokens} tokens (a grammar ended early?)"
            if tokens / seconds > best.get(side, (0.0, 0.0))[0]:
                best[side] = (tokens / seconds, 1e3 * mask.seconds / steps)
    print(f"\n{args.dtype}; {args.batch} sequences x {args.output_len} tokens, greedy; best of {args.rounds} rounds")
    print(f"{'workload':<14}{'tok/s':>10}{'mask ms/step':>14}{'vs plain':>10}")
    for side in sides:
        tps, mask_ms = best[side]
        print(f"{side:<14}{tps:>10.1f}{mask_ms:>14.2f}{tps / best['plain'][0]:>9.2f}x")


if __name__ == "__main__":
    main()
