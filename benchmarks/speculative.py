"""Benchmark: n-gram speculative decoding against none, same model, same prompts, in one run.

    python -m benchmarks.speculative [--dtype bfloat16] [--rounds 2] [--batches 1,2,4,8,16,32]

Workloads: the eight input-grounded chat requests of `benchmarks.grounded` (repeat, quote or
edit a 300-token text; greedy, up to --output-len tokens, EOS ends them), run in groups of B at
once for each batch size B (cycled to fill batches above 8); and the random-prompt workload of
`python -m benchmarks` (128-token random prompts, 128 tokens, EOS ignored) at batch 1 and at
the largest batch. Two engines
live side by side, one with speculation always on (disable_by_batch_size above every batch
here, to measure where it stops paying) and one without; rounds alternate between them and the
figures are the best of the rounds.
"""
from __future__ import annotations

import argparse
import random
import time

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from common.speculative_config import SpeculativeConfig
from benchmarks.grounded import grounded_messages
from benchmarks.workloads import random_prompts
from engine.llm_engine import LLMEngine


def run(engine: LLMEngine, prompts: list[list[int]], batch: int, params: SamplingParams) -> tuple[float, int]:
    """(seconds, output tokens) for the prompts in groups of `batch`, each group to its end."""
    engine.scheduler.reset_prefix_cache()
    tokens, start = 0, time.perf_counter()
    for g in range(0, len(prompts), batch):
        for i, p in enumerate(prompts[g:g + batch]):
            engine.add_request(f"b{g}-{i}", p, params)
        while engine.has_unfinished():
            tokens += sum(len(d.new_token_ids) for d in engine.step())
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    spec = SpeculativeConfig(num_speculative_tokens=args.num_speculative_tokens, disable_by_batch_size=max(batches))
    common = dict(model=args.model, dtype=args.dtype, device=args.device, max_model_len=1024,
                  max_num_seqs=max(batches), kv_cache_memory=512 << 20)
    engines = {"plain": LLMEngine(EngineConfig(**common)),
               "ngram": LLMEngine(EngineConfig(**common, speculative_config=spec))}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(engines["plain"].model_dir))
    grounded = [tok.encode(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False) for m in grounded_messages()]
    randoms = random_prompts(random.Random(0), engines["plain"].vocab_size, 1, 128)
    greedy = SamplingParams(temperature=0, max_tokens=args.output_len)
    forced = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    # batches above 8 cycle through the eight requests
    workloads = [(f"grounded, batch {b}", (grounded * b)[: max(b, len(grounded))], b, greedy) for b in batches]
    workloads.append(("random prompt, batch 1", randoms, 1, forced))
    workloads.append((f"random prompts, batch {max(batches)}",
                      random_prompts(random.Random(1), engines["plain"].vocab_size, max(batches), 128), max(batches),
                      forced))
    for engine in engines.values():
        run(engine, grounded[:2], 2, SamplingParams(temperature=0, max_tokens=8))  # warm-up
    best: dict[tuple[str, str], float] = {}
    acceptance: dict[str, tuple[int, int]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for name, prompts, batch, params in workloads:
            for side, engine in engines.items():
                speculator = engine.scheduler.speculator
                if speculator is not None:
                    speculator.take_stats()
                seconds, tokens = run(engine, prompts, batch, params)
                best[(name, side)] = max(best.get((name, side), 0.0), tokens / seconds)
                stats = speculator.take_stats() if speculator is not None else None
                if stats is not None:
                    acceptance[name] = (stats.num_accepted_tokens, stats.num_draft_tokens)
    print(f"\n{args.dtype}; n-gram drafts of up to {spec.num_speculative_tokens} tokens (lookup "
          f"{spec.prompt_lookup_min}-{spec.prompt_lookup_max}); greedy; best of {args.rounds} rounds")
    print(f"{'workload':<26}{'plain tok/s':>13}{'ngram tok/s':>13}{'speed-up':>10}{'accepted':>22}")
    for name, *_ in workloads:
        plain, ngram = best[(name, "plain")], best[(name, "ngram")]
        accepted, drafted = acceptance.get(name, (0, 0))
        rate = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "no drafts"
        print(f"{name:<26}{plain:>13.1f}{ngram:>13.1f}{ngram / plain:>9.2f}x{rate:>22}")


if __name__ == "__main__":
    main()
