"""Our engine's timed workloads: greedy at batch 1, greedy and sampled at a batch of N.

Used by `python -m benchmarks` (ours against transformers) and run as a script by
`benchmarks.commits` against another checkout of this repository:

    python benchmarks/workloads.py --json out.json   (cwd and PYTHONPATH: the checkout to time)

so it uses only names every version of the engine has, and loads its two sibling modules from the
checkout's own `benchmarks` (`engine.bench` before the benchmarks left the engine), or by file
path when the checkout has neither.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

# The sampled workload: what a chat client typically sends.
SAMPLED = dict(temperature=0.8, top_p=0.95, presence_penalty=0.5)


def _sibling(name: str):
    for package in ("benchmarks", "engine.bench"):
        try:
            return importlib.import_module(f"{package}.{name}")
        except ImportError:
            continue
    # an older checkout without them: load ours next to this file
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _import(*candidates: str):
    for dotted in candidates:
        module, _, name = dotted.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError:
            continue
    raise ImportError(f"none of {candidates}")


def sampling_params(output_len: int, sampled: bool, batch_invariant: bool = False):
    params_cls = _import("common.messages.SamplingParams", "engine.messages.SamplingParams")
    fields = dict(SAMPLED if sampled else dict(temperature=0.0))
    if batch_invariant:  # only then: older checkouts have no such field
        fields["batch_invariant"] = True
    return params_cls(max_tokens=output_len, ignore_eos=True, **fields)


def build_engine(model: str | None, dtype: str, device: str, batch: int, max_num_batched_tokens: int,
                 max_model_len: int, **engine_fields):
    """`engine_fields`: more EngineConfig fields (`--engine KEY=VALUE`)."""
    config_cls = _import("common.engine_config.EngineConfig", "engine.config.EngineConfig")
    from engine.llm_engine import LLMEngine

    return LLMEngine(config_cls(model=model, dtype=dtype, device=device, max_num_seqs=batch,
                                max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                                kv_cache_memory=None, **engine_fields))


def engine_field(text: str) -> tuple[str, object]:
    """KEY=VALUE (an EngineConfig field) -> (key, value as bool, int, float or str)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def random_prompts(rnd: random.Random, vocab_size: int, n: int, length: int) -> list[list[int]]:
    return [[rnd.randrange(100, vocab_size) for _ in range(length)] for _ in range(n)]


def run_ours(engine, prompts: list[list[int]], output_len: int, sampled: bool = False, batch_invariant: bool = False):
    """All prompts at once, to the end; a RunResult with the per-step split."""
    runs, step_timer = _sibling("runs"), _sibling("step_timer")
    params = sampling_params(output_len, sampled, batch_invariant)
    reset = getattr(engine.scheduler, "reset_prefix_cache", None) or engine.block_manager.reset_prefix_cache
    reset()  # every round starts cold, like transformers
    times = step_timer.StepTimes()
    first: dict[str, float] = {}
    tokens = 0
    with step_timer.timed_engine(engine, times):
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(f"bench-{i}", p, params)
        while engine.has_unfinished():
            deltas = step_timer.timed_step(engine, times)
            now = time.perf_counter()
            for d in deltas:
                first.setdefault(d.request_id, now)
                tokens += len(d.new_token_ids)
        end = time.perf_counter()
    return runs.RunResult(len(prompts), tokens, end - start, sum(t - start for t in first.values()) / len(first),
                          end - max(first.values()), steps=times.steps, host_ms=times.ms_per_step(times.host_s),
                          forward_ms=times.ms_per_step(times.forward_s), sample_ms=times.ms_per_step(times.sample_s))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="our engine's workloads, one round, figures as JSON")
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--engine", type=engine_field, action="append", default=[], metavar="KEY=VALUE",
                    help="an EngineConfig field (kv_cache_dtype=int8); repeatable")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    engine = build_engine(args.model, args.dtype, args.device, args.batch, args.max_num_batched_tokens,
                          args.prompt_len + args.output_len + 16, **dict(args.engine))
    rnd = random.Random(0)
    vocab = engine.vocab_size
    one, many = random_prompts(rnd, vocab, 1, args.prompt_len), random_prompts(rnd, vocab, args.batch, args.prompt_len)
    run_ours(engine, random_prompts(rnd, vocab, 2, args.prompt_len), 8)  # warm-up
    results = {"batch 1": run_ours(engine, one, args.output_len),
               f"{args.batch} seqs": run_ours(engine, many, args.output_len),
               f"{args.batch} seqs sampled": run_ours(engine, many, args.output_len, sampled=True)}
    Path(args.json).write_text(json.dumps({k: asdict(v) | {"output_tps": v.output_tps, "decode_tps": v.decode_tps}
                                                for k, v in results.items()}))


if __name__ == "__main__":
    main()
