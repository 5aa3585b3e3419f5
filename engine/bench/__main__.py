"""Benchmark: our engine vs transformers on the same model, prompts and dtype, in one run.

    python -m engine.bench [--dtype bfloat16|float32] [--rounds 2] [--batch 32]

Runs alternate (ours, transformers, ours, transformers, ...) so a noisy shared machine hits both
alike; each figure is the best of the rounds. Workloads: 1 and `--batch` sequences, each with a
`--prompt-len` random prompt and `--output-len` new tokens (greedy, EOS ignored). The share of
the machine's limits uses limits measured in this run: for batch 1, weight bytes read per decode
step x steps/s / memory bandwidth; for the batch, model FLOPs x tokens/s (prompt + output) / the
GEMM rate in the same dtype.
"""
from __future__ import annotations

import argparse
import json
import random

import torch

from engine.bench.runs import RunResult, run_hf_generate, run_hf_generate_batch, run_ours
from common.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.bench.limits import gemm_flops, memory_bandwidth
from engine.models.llama import ModelArch


def linear_params(arch: ModelArch) -> int:
    """Parameters read by the matmuls of one token's forward (LM head included, lookups not)."""
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    per_layer = arch.hidden_size * (q + 2 * kv) + q * arch.hidden_size + 3 * arch.hidden_size * arch.intermediate_size
    return arch.num_layers * per_layer + arch.hidden_size * arch.vocab_size


def flops_per_token(arch: ModelArch, context: int) -> float:
    attention = 4 * arch.num_layers * arch.num_heads * arch.head_dim * context  # QK^T and PV
    return 2 * linear_params(arch) + attention


def best(results: list[RunResult]) -> RunResult:
    return max(results, key=lambda r: r.output_tps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="Hugging Face folder; default: the embedded model")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, device=args.device,
                                    max_num_seqs=args.batch, max_num_batched_tokens=args.max_num_batched_tokens,
                                    max_model_len=args.prompt_len + args.output_len + 16,
                                    kv_cache_memory=None))
    hf = AutoModelForCausalLM.from_pretrained(str(engine.model_dir), dtype=engine.dtype).to(engine.device).eval()
    rnd = random.Random(0)
    vocab = engine.vocab_size

    def prompts(n):
        return [[rnd.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(n)]

    one, many = prompts(1), prompts(args.batch)
    run_ours(engine, prompts(2), 8)  # warm-up both paths
    run_hf_generate(hf, prompts(1), 8)
    results: dict[str, list[RunResult]] = {k: [] for k in ("ours_1", "hf_1", "ours_n", "hf_n", "hf_cb_n")}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        results["ours_1"].append(run_ours(engine, one, args.output_len))
        results["hf_1"].append(run_hf_generate(hf, one, args.output_len))
        results["ours_n"].append(run_ours(engine, many, args.output_len))
        results["hf_n"].append(run_hf_generate(hf, many, args.output_len))
        try:
            results["hf_cb_n"].append(run_hf_generate_batch(hf, many, args.output_len))
        except Exception as e:  # the continuous-batching path may not run on every device
            print(f"transformers generate_batch failed: {type(e).__name__}: {e}")
    bandwidth = memory_bandwidth(engine.device)
    gemm = gemm_flops(engine.dtype, engine.device)
    report(engine, args, {k: best(v) for k, v in results.items() if v}, bandwidth, gemm)


def report(engine: LLMEngine, args, r: dict[str, RunResult], bandwidth: float, gemm: float) -> None:
    arch = engine.model.arch
    elem = torch.empty((), dtype=engine.dtype).element_size()
    weight_bytes = linear_params(arch) * elem
    hf_n = max((r[k] for k in ("hf_n", "hf_cb_n") if k in r), key=lambda x: x.output_tps)
    hf_n_name = "generate_batch" if hf_n is r.get("hf_cb_n") else "generate"
    ctx = args.prompt_len + args.output_len // 2
    tokens_per_seq = args.prompt_len + args.output_len
    share_bw = weight_bytes * r["ours_1"].decode_tps / bandwidth
    total_tps = lambda x: x.num_seqs * tokens_per_seq / x.seconds  # noqa: E731
    share_flops = flops_per_token(arch, ctx) * total_tps(r["ours_n"]) / gemm
    dtype = str(engine.dtype).removeprefix("torch.")
    print(f"\nmodel {engine.model_dir.name}, {dtype}, {engine.device}, {torch.get_num_threads()} threads; "
          f"prompts {args.prompt_len} tokens, {args.output_len} new tokens, greedy, EOS ignored")
    print(f"measured: memory read {bandwidth / 1e9:.1f} GB/s, {dtype} GEMM {gemm / 1e9:.0f} GFLOP/s; "
          f"weights read per decode step {weight_bytes / 1e6:.0f} MB")
    print(f"{'workload':<22}{'ours tok/s':>12}{'hf tok/s':>12}{'ratio':>8}{'ours TTFT':>12}{'hf TTFT':>10}  limit reached")
    print(f"{'batch 1':<22}{r['ours_1'].output_tps:>12.1f}{r['hf_1'].output_tps:>12.1f}"
          f"{r['ours_1'].output_tps / r['hf_1'].output_tps:>7.2f}x{r['ours_1'].ttft * 1e3:>10.0f}ms"
          f"{r['hf_1'].ttft * 1e3:>8.0f}ms  {share_bw:.0%} of bandwidth (decode {r['ours_1'].decode_tps:.1f} tok/s)")
    print(f"{f'{args.batch} seqs (hf {hf_n_name})':<22}{r['ours_n'].output_tps:>12.1f}{hf_n.output_tps:>12.1f}"
          f"{r['ours_n'].output_tps / hf_n.output_tps:>7.2f}x{r['ours_n'].ttft * 1e3:>10.0f}ms"
          f"{hf_n.ttft * 1e3:>8.0f}ms  {share_flops:.0%} of {dtype} GEMM rate")
    for key, name in (("hf_n", "generate"), ("hf_cb_n", "generate_batch")):
        if key in r:
            print(f"  transformers {name} at {args.batch} seqs: {r[key].output_tps:.1f} tok/s")
    if args.json:
        figures = {k: vars(v) | {"output_tps": v.output_tps, "decode_tps": v.decode_tps} for k, v in r.items()}
        with open(args.json, "w") as f:
            json.dump({"dtype": dtype, "bandwidth": bandwidth, "gemm_flops": gemm, "share_bandwidth": share_bw,
                       "share_flops": share_flops, "runs": figures}, f, indent=2)


if __name__ == "__main__":
    main()
