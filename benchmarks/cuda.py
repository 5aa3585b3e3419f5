"""The CUDA workloads of `python -m benchmarks --device cuda` (the GPU check runs them).

    python -m benchmarks --device cuda [--num-seqs 256] [--json out.json]
    python -m benchmarks.cuda [--device cuda] [...]          (the same; what deploy/gpu-check.sh runs)

1. Offline throughput in nano-vllm's benchmark shape: Qwen3-0.6B's architecture with random
   weights (engine/models/configs/qwen3-0.6b, `load_format="dummy"`), 256 sequences of random
   ids, prompt and output lengths uniform in 100..1024, EOS ignored, temperature 0.6; output tokens
   over wall time. Anchors on an A800: vLLM 8.6k tok/s, nano-vllm 10k; an H200 has 2.4x its
   memory bandwidth; target on an H200: 20k tok/s.
2. Batch-1 decode TPOT of the same model, with the captured decode graphs (async scheduling on,
   the default on CUDA, and off) and with --enforce-eager. Anchor: 2.72 ms with CUDA graphs
   (xLLM); target on an H200: 2.5 ms.
   (Measured first: they take seconds, the offline run the most.)
3. With --profile PATH: torch.profiler's tables of decode steps at 1 and --num-seqs sequences.

Nothing is compared against a peer in this run: the CUDA machine has none installed.

The same code runs on a CPU at toy sizes, which is how `deploy/gpu-check.sh --cpu` rehearses the
GPU check: `python -m benchmarks.cuda --device cpu --model DIR` (any config folder: random weights from its config.json)
`--num-seqs 6 --lengths 8,24 --tpot-tokens 8,12 --kv-cache-memory 16777216`.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path

import torch

import engine.models
from benchmarks.workloads import run_ours
from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.llm_engine import LLMEngine

QWEN3_06B = Path(engine.models.__file__).resolve().parent / "configs" / "qwen3-0.6b"


def build(device: str, dtype: str, max_num_seqs: int, enforce_eager: bool, max_model_len: int,
          async_scheduling: str = "auto", model: Path = QWEN3_06B, kv_cache_memory: int | None = None) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), load_format="dummy", dtype=dtype, device=device,
                                  max_num_seqs=max_num_seqs, max_num_batched_tokens=16384, max_model_len=max_model_len,
                                  enforce_eager=enforce_eager, async_scheduling=async_scheduling,
                                  kv_cache_memory=kv_cache_memory))


def generate(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[int, float]:
    """All at once, to the end: (output tokens, seconds)."""
    start = time.perf_counter()
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, p)
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(d.new_token_ids) for d in engine.step())
    return tokens, time.perf_counter() - start


def offline_throughput(engine: LLMEngine, num_seqs: int, min_len: int = 100, max_len: int = 1024,
                       seed: int = 0) -> dict[str, float]:
    """nano-vllm's bench.py: random prompts and output lengths, sampled at temperature 0.6."""
    rnd = random.Random(seed)
    top = min(10000, engine.vocab_size - 1)  # nano-vllm's ids: 0..10000
    prompts = [[rnd.randint(0, top) for _ in range(rnd.randint(min_len, max_len))] for _ in range(num_seqs)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=rnd.randint(min_len, max_len))
              for _ in range(num_seqs)]
    generate(engine, [[1, 2, 3]], [SamplingParams(max_tokens=4)])  # warm-up
    tokens, seconds = generate(engine, prompts, params)
    return {"output_tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "prompt_tokens": sum(map(len, prompts))}


def batch1_decode(engine: LLMEngine, prompt_len: int = 128, output_len: int = 256):
    """One greedy sequence after a warm-up: the RunResult (decode rate, the per-step split)."""
    rnd = random.Random(1)
    prompt = [rnd.randint(0, min(10000, engine.vocab_size - 1)) for _ in range(prompt_len)]
    run_ours(engine, [prompt], 8)  # warm-up
    return run_ours(engine, [prompt], output_len)


def batch1_tpot(engine: LLMEngine, prompt_len: int = 128, output_len: int = 256) -> float:
    """Milliseconds per output token after the first, one greedy sequence."""
    return 1e3 / batch1_decode(engine, prompt_len, output_len).decode_tps


def profile_decode(engine: LLMEngine, num_seqs: int, steps: int, path: Path) -> None:
    """torch.profiler over `steps` decode steps of `num_seqs` sequences (prompts of 128 ids, run to
    the decode phase first): the ops by device time and by host time, written to `path`."""
    from torch.profiler import ProfilerActivity, profile

    rnd = random.Random(2)
    top = min(10000, engine.vocab_size - 1)
    for i in range(num_seqs):
        engine.add_request(f"profile-{num_seqs}-{i}", [rnd.randint(0, top) for _ in range(128)],
                           SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=steps + 16))
    for _ in range(8):  # past the prefill, into whole decode batches
        engine.step()
    on_cuda = engine.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_cuda else [])]) as prof:
        for _ in range(steps):
            engine.step()
        if on_cuda:
            torch.cuda.synchronize(engine.device)
    while engine.has_unfinished():
        engine.step()
    events = prof.key_averages()
    with path.open("a") as f:
        f.write(f"=== {steps} decode steps of {num_seqs} sequences: by device time ===\n")
        f.write(events.table(sort_by="self_device_time_total" if on_cuda else "self_cpu_time_total",
                             row_limit=25) + "\n")
        f.write(f"=== {steps} decode steps of {num_seqs} sequences: by host time ===\n")
        f.write(events.table(sort_by="cpu_time_total", row_limit=25) + "\n")


def free_device_memory() -> None:
    """After the last reference to an engine is dropped: its KV cache and graphs back to CUDA."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from engine.cpuinfo import cpuinfo_field

    return cpuinfo_field("model name") or "CPU"


def _pair(text: str) -> tuple[int, int]:
    first, second = (int(x) for x in text.split(","))
    return first, second


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--model", type=Path, default=QWEN3_06B,
                    help="a folder with a config.json, run on random weights (default: Qwen3-0.6B's architecture)")
    ap.add_argument("--lengths", type=_pair, default=(100, 1024), metavar="MIN,MAX",
                    help="the offline run's prompt and output lengths, uniform in MIN..MAX")
    ap.add_argument("--tpot-tokens", type=_pair, default=(128, 256), metavar="PROMPT,OUTPUT",
                    help="the batch-1 TPOT run's prompt and output tokens")
    ap.add_argument("--kv-cache-memory", type=int, default=None, metavar="BYTES",
                    help="default: sized from --gpu-memory-utilization on CUDA, the engine's CPU default on a CPU")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", default=None, metavar="PATH",
                    help="afterwards, torch.profiler tables of decode steps at 1 and --num-seqs sequences, into PATH")
    args = ap.parse_args(argv)
    figures: dict[str, object] = {"device": device_name(torch.device(args.device))}
    arch = "Qwen3-0.6B architecture" if args.model == QWEN3_06B else f"{args.model.name}'s architecture"
    # each figure is printed as it is measured: a run cut short still shows what it got
    print(f"\n{arch}, random weights, {args.dtype}, {figures['device']}", flush=True)
    print(f"{'workload':<44}{'ours':>12}  anchor / target", flush=True)

    tpot: dict[str, float] = {}
    variants = (("graphs", "CUDA graphs", False, "auto"),
                ("graphs-sync", "CUDA graphs, async sched. off", False, "off"),
                ("eager", "--enforce-eager", True, "auto"))
    for name, label, eager, async_scheduling in variants:
        small = build(args.device, args.dtype, 8, enforce_eager=eager, max_model_len=4096,
                      async_scheduling=async_scheduling, model=args.model, kv_cache_memory=args.kv_cache_memory)
        result = batch1_decode(small, *args.tpot_tokens)
        tpot[name] = 1e3 / result.decode_tps
        anchor = ("xLLM 2.72 (graphs); target 2.5" if name == "graphs"
                  else f"{tpot[name] / tpot['graphs']:.2f}x the default's TPOT")
        print(f"{f'batch-1 TPOT, {label} (ms)':<44}{tpot[name]:>12.2f}  {anchor}", flush=True)
        print(f"{'':<44}{'':>12}  per step: host {result.host_ms:.2f} ms (the wait for the GPU in it), "
              f"forward launch {result.forward_ms:.2f}, sampler {result.sample_ms:.2f}", flush=True)
        del small
        free_device_memory()
    figures["tpot_ms"] = tpot

    start = time.perf_counter()
    engine = build(args.device, args.dtype, 512, enforce_eager=False, max_model_len=4096, model=args.model,
                   kv_cache_memory=args.kv_cache_memory)
    figures["build_s"] = time.perf_counter() - start
    offline = offline_throughput(engine, args.num_seqs, *args.lengths)
    figures["offline"] = offline
    low, high = args.lengths
    print(f"{f'offline, {args.num_seqs} seqs, in/out {low}..{high} (tok/s)':<44}{offline['tok_per_s']:>12.0f}"
          f"  vLLM 8.6k, nano-vllm 10k (A800); target 20k (H200)", flush=True)
    print(f"(offline: {offline['output_tokens']} output tokens, {offline['prompt_tokens']} prompt tokens in "
          f"{offline['seconds']:.1f} s; its engine built in {figures['build_s']:.0f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    if args.profile:
        Path(args.profile).write_text("")
        for num_seqs, steps in ((1, 30), (args.num_seqs, 10)):
            profile_decode(engine, num_seqs, steps, Path(args.profile))
        print(f"(decode-step profiles in {args.profile})", flush=True)


if __name__ == "__main__":
    main()
