"""Benchmark: batch-invariant requests against ordinary ones, same engine, same prompts.

    python -m benchmarks --batch-invariant [--dtype bfloat16] [--rounds 3] [--batch 32]

Workloads, each run with every request ordinary and with every request asking for
`batch_invariant`, in alternating rounds (figures: the best round): 1 sequence and `--batch`
sequences, greedy and sampled (temperature 0.8, top_p 0.95, presence_penalty 0.5), random
`--prompt-len` prompts and `--output-len` new tokens with EOS ignored. The cost per row is
1 - (invariant tok/s / ordinary tok/s) at that batch: every row of the batch asks, so each pays it.
"""
from __future__ import annotations

import argparse
import random

import torch

from benchmarks.runs import RunResult
from benchmarks.workloads import build_engine, random_prompts, run_ours


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    args = ap.parse_args(argv)
    engine = build_engine(args.model, args.dtype, args.device, args.batch, args.max_num_batched_tokens,
                          args.prompt_len + args.output_len + 16)
    rnd = random.Random(0)
    workloads = {"batch 1": random_prompts(rnd, engine.vocab_size, 1, args.prompt_len),
                 f"{args.batch} seqs": random_prompts(rnd, engine.vocab_size, args.batch, args.prompt_len)}
    run_ours(engine, random_prompts(rnd, engine.vocab_size, 2, 16), 4, batch_invariant=True)  # warm-up
    run_ours(engine, random_prompts(rnd, engine.vocab_size, 2, 16), 4)
    results: dict[tuple[str, bool, bool], list[RunResult]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for name, prompts in workloads.items():
            for sampled in (False, True):
                for invariant in (False, True):
                    results.setdefault((name, sampled, invariant), []).append(
                        run_ours(engine, prompts, args.output_len, sampled=sampled, batch_invariant=invariant))
    best = {k: max(v, key=lambda x: x.output_tps) for k, v in results.items()}
    dtype = str(engine.dtype).removeprefix("torch.")
    print(f"\nmodel {engine.model_dir.name}, {dtype}, {engine.device}, {torch.get_num_threads()} threads; prompts "
          f"{args.prompt_len} tokens, {args.output_len} new tokens, EOS ignored; best of {args.rounds} rounds")
    print(f"{'workload':<24}{'ordinary tok/s':>16}{'invariant tok/s':>17}{'ratio':>8}{'ordinary TTFT':>15}"
          f"{'invariant TTFT':>16}")
    for name in workloads:
        for sampled in (False, True):
            plain, inv = best[(name, sampled, False)], best[(name, sampled, True)]
            label = f"{name} {'sampled' if sampled else 'greedy'}"
            ratio = inv.output_tps / plain.output_tps
            print(f"{label:<24}{plain.output_tps:>16.1f}{inv.output_tps:>17.1f}{ratio:>7.2f}x"
                  f"{plain.ttft * 1e3:>13.0f}ms{inv.ttft * 1e3:>14.0f}ms")
    print("\nper engine step (ms)       ordinary forward  invariant forward")
    for name in workloads:
        plain, inv = best[(name, False, False)], best[(name, False, True)]
        print(f"  {name + ' greedy':<24}{plain.forward_ms:>16.1f}{inv.forward_ms:>19.1f}")
