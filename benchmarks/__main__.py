"""Benchmark: our engine vs transformers on the same model, prompts and dtype, in one run.

    python -m benchmarks [--dtype bfloat16|float32] [--rounds 2] [--batch 32]
    python -m benchmarks --speculative [...]   (n-gram speculative decoding against none)
    python -m benchmarks --structured [...]    (JSON-schema-constrained decoding against none)
    python -m benchmarks --batch-invariant [...]  (batch-invariant requests against ordinary ones)
    python -m benchmarks --device cuda [...]   (the CUDA workloads: benchmarks/cuda.py)

Runs alternate (ours, transformers, ours, transformers, ...) so a noisy shared machine hits both
alike; each figure is the best of the rounds. Workloads: 1 and `--batch` sequences, each with a
`--prompt-len` random prompt and `--output-len` new tokens (greedy, EOS ignored), plus ours
alone on the batch with sampling (temperature 0.8, top_p 0.95, presence_penalty 0.5); for each of
ours, where a step's time goes (host: schedule + input preparation + update; forward; sampling).
The share of
the machine's limits uses limits measured in this run: for batch 1, weight bytes read per decode
step x steps/s / memory bandwidth; for the batch, model FLOPs x tokens/s (prompt + output) / the
GEMM rate in the same dtype.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

import torch

from benchmarks.runs import RunResult, run_hf_generate, run_hf_generate_batch
from benchmarks.workloads import build_engine, random_prompts, run_ours
from engine.llm_engine import LLMEngine
from engine.models.config import ModelArch
from engine.models.linear import weight_bytes_per_step
from engine.roofline.measure import gemm_flops, memory_bandwidth


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


def _device_argument(argv: list[str]) -> str:
    at = argv.index("--device") if "--device" in argv else -1
    return argv[at + 1] if 0 <= at < len(argv) - 1 else ""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--speculative":  # n-gram speculation against none (benchmarks/speculative.py)
        from benchmarks.speculative import main as speculative_main

        return speculative_main(argv[1:])
    if argv and argv[0] == "--structured":  # grammar masks against none (benchmarks/structured.py)
        from benchmarks.structured import main as structured_main

        return structured_main(argv[1:])
    if argv and argv[0] == "--batch-invariant":  # per-request invariance against none (benchmarks/batch_invariant.py)
        from benchmarks.batch_invariant import main as batch_invariant_main

        return batch_invariant_main(argv[1:])
    if _device_argument(argv).startswith("cuda"):  # the CUDA workloads (benchmarks/cuda.py)
        from benchmarks.cuda import main as cuda_main

        return cuda_main(argv)
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

    engine = build_engine(args.model, args.dtype, args.device, args.batch, args.max_num_batched_tokens,
                          args.prompt_len + args.output_len + 16)
    hf = AutoModelForCausalLM.from_pretrained(str(engine.model_dir), dtype=engine.dtype).to(engine.device).eval()
    rnd = random.Random(0)

    def prompts(n):
        return random_prompts(rnd, engine.vocab_size, n, args.prompt_len)

    one, many = prompts(1), prompts(args.batch)
    run_ours(engine, prompts(2), 8)  # warm-up both paths
    run_hf_generate(hf, prompts(1), 8)
    results: dict[str, list[RunResult]] = {
        k: [] for k in ("ours_1", "hf_1", "ours_n", "hf_n", "hf_cb_n", "ours_n_sampled")}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        results["ours_1"].append(run_ours(engine, one, args.output_len))
        results["hf_1"].append(run_hf_generate(hf, one, args.output_len))
        results["ours_n"].append(run_ours(engine, many, args.output_len))
        results["hf_n"].append(run_hf_generate(hf, many, args.output_len))
        results["ours_n_sampled"].append(run_ours(engine, many, args.output_len, sampled=True))
        try:
            results["hf_cb_n"].append(run_hf_generate_batch(hf, many, args.output_len))
        except Exception as e:  # the continuous-batching path may not run on every device
            print(f"transformers generate_batch failed: {type(e).__name__}: {e}")
    bandwidth = memory_bandwidth(engine.device)
    gemm = gemm_flops(engine.dtype, engine.device)
    report(engine, args, {k: best(v) for k, v in results.items() if v}, bandwidth, gemm)


def report(engine: LLMEngine, args, r: dict[str, RunResult], bandwidth: float, gemm: float) -> None:
    arch = engine.model.arch
    weight_bytes = weight_bytes_per_step(engine.model, 1, engine.dtype)  # the codes' bytes where they run
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
    print(f"{'workload':<22}{'ours tok/s':>12}{'hf tok/s':>12}{'ratio':>8}{'ours TTFT':>12}{'hf TTFT':>10}"
          "  limit reached")
    print(f"{'batch 1':<22}{r['ours_1'].output_tps:>12.1f}{r['hf_1'].output_tps:>12.1f}"
          f"{r['ours_1'].output_tps / r['hf_1'].output_tps:>7.2f}x{r['ours_1'].ttft * 1e3:>10.0f}ms"
          f"{r['hf_1'].ttft * 1e3:>8.0f}ms  {share_bw:.0%} of bandwidth (decode {r['ours_1'].decode_tps:.1f} tok/s)")
    print(f"{f'{args.batch} seqs (hf {hf_n_name})':<22}{r['ours_n'].output_tps:>12.1f}{hf_n.output_tps:>12.1f}"
          f"{r['ours_n'].output_tps / hf_n.output_tps:>7.2f}x{r['ours_n'].ttft * 1e3:>10.0f}ms"
          f"{hf_n.ttft * 1e3:>8.0f}ms  {share_flops:.0%} of {dtype} GEMM rate")
    for key, name in (("hf_n", "generate"), ("hf_cb_n", "generate_batch")):
        if key in r:
            print(f"  transformers {name} at {args.batch} seqs: {r[key].output_tps:.1f} tok/s")
    sampled = r["ours_n_sampled"]
    print(f"{f'{args.batch} seqs sampled':<22}{sampled.output_tps:>12.1f}{'':>12}{'':>8}{sampled.ttft * 1e3:>10.0f}ms"
          f"{'':>10}  {sampled.output_tps / r['ours_n'].output_tps:.2f}x our greedy tok/s "
          f"(temperature 0.8, top_p 0.95, presence_penalty 0.5)")
    print(f"\nours, per engine step{'':<4}{'steps':>8}{'host ms':>10}{'forward ms':>12}{'sample ms':>11}"
          "   (host = schedule + input preparation + update)")
    for key, name in (("ours_1", "batch 1"), ("ours_n", f"{args.batch} seqs"),
                      ("ours_n_sampled", f"{args.batch} seqs sampled")):
        x = r[key]
        print(f"  {name:<23}{x.steps:>8}{x.host_ms:>10.2f}{x.forward_ms:>12.1f}{x.sample_ms:>11.2f}")
    if args.json:
        figures = {k: vars(v) | {"output_tps": v.output_tps, "decode_tps": v.decode_tps} for k, v in r.items()}
        with open(args.json, "w") as f:
            json.dump({"dtype": dtype, "bandwidth": bandwidth, "gemm_flops": gemm, "share_bandwidth": share_bw,
                       "share_flops": share_flops, "runs": figures}, f, indent=2)


if __name__ == "__main__":
    main()
