"""Output tok/s of requests spread over LoRA adapters against the base model's, one server, one run.

Makes `--adapters` peft adapters of rank `--rank` on every projection of the default model, starts
the server with them resident (`--max-loras` = their count), and runs the load generator in
alternating rounds at the same concurrency with the same prompts: on the base model, then with the
requests spread round-robin over the adapters (each dataset line names its adapter). Prints each
round's figures and the ratio of their medians. A benchmark, never a test: run it alone on the machine.

    python -m benchmarks.lora_throughput --concurrency 32 --num-prompts 64 --output-len 64 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common.default_model import DEFAULT_MODEL_NAME, ensure_default_model
from loadtest.servers import ManagedServer, free_port

WORDS = ("the river runs past old stone houses while children count boats and the baker sells warm bread "
         "to travelers who ask about the road north").split()


def make_adapters(root: Path, count: int, rank: int) -> list[Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir = ensure_default_model()
    folders = []
    for i in range(count):
        torch.manual_seed(100 + i)
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False, lora_dropout=0.0,
                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"])
        model = get_peft_model(base, config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.3)
        folders.append(root / f"adapter{i}")
        model.save_pretrained(str(folders[-1]))
    return folders


def write_dataset(path: Path, num_prompts: int, models: list[str | None], input_words: int, tag: str) -> None:
    """Prompts that begin with `tag`: no run finds another run's prompts in the prefix cache."""
    with open(path, "w") as f:
        for i in range(num_prompts):
            words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(input_words)]
            line: dict = {"prompt": f"{tag}, request {i}: " + " ".join(words)}
            model = models[i % len(models)]
            if model is not None:
                line["model"] = model
            f.write(json.dumps(line) + "\n")


def run_load(url: str, dataset: Path, out: Path, args) -> float:
    cmd = [sys.executable, "-m", "loadtest", "--base-url", f"{url}/v1", "--endpoint", "completions",
           "--dataset", str(dataset), "--num-prompts", str(args.num_prompts), "--concurrency", str(args.concurrency),
           "--output-len", str(args.output_len), "--ignore-eos", "--warmup", "4", "--output-dir", str(out),
           "--model", DEFAULT_MODEL_NAME]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    for summary in out.rglob("*.json"):
        text = summary.read_text()
        if '"output_throughput"' in text:
            return _find(json.loads(text))
    raise RuntimeError(f"no output_throughput under {out}")


def _find(obj) -> float:
    if isinstance(obj, dict):
        if "output_throughput" in obj:
            return float(obj["output_throughput"])
        for v in obj.values():
            try:
                return _find(v)
            except LookupError:
                pass
    if isinstance(obj, list):
        for v in obj:
            try:
                return _find(v)
            except LookupError:
                pass
    raise LookupError("output_throughput")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--input-words", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="base / adapters runs, alternating")
    parser.add_argument("server_args", nargs="*", help="more server flags (after --)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    folders = make_adapters(root, args.adapters, args.rank)
    names = [f"adapter{i}" for i in range(args.adapters)]
    for i in range(args.rounds):
        write_dataset(root / f"base-{i}.jsonl", args.num_prompts, [None], args.input_words, f"Base run {i}")
        write_dataset(root / f"lora-{i}.jsonl", args.num_prompts, list(names), args.input_words, f"Adapter run {i}")
    port = free_port()
    modules = [f"{n}={f}" for n, f in zip(names, folders, strict=True)]
    server = ManagedServer("server", [sys.executable, "-m", "server", "--port", str(port), "--enable-lora",
                                      "--max-loras", str(args.adapters), "--max-lora-rank", str(args.rank),
                                      "--max-num-seqs", str(args.concurrency), "--lora-modules", *modules,
                                      *args.server_args], port, root)
    try:
        server.wait_ready(600, probe="/health", poll_s=0.5)
        bases, loras = [], []
        for i in range(args.rounds):
            bases.append(run_load(server.url, root / f"base-{i}.jsonl", root / f"out-base-{i}", args))
            loras.append(run_load(server.url, root / f"lora-{i}.jsonl", root / f"out-lora-{i}", args))
            print(f"round {i + 1}: base {bases[-1]:.1f}, adapters {loras[-1]:.1f} output tok/s", flush=True)
    finally:
        server.stop()
    base, lora = statistics.median(bases), statistics.median(loras)
    print(f"base model:             {base:8.1f} output tok/s (median; c={args.concurrency}, {args.num_prompts} "
          f"requests, {args.output_len} tokens each)")
    print(f"{args.adapters} adapters of rank {args.rank}: {lora:8.1f} output tok/s")
    print(f"ratio: {lora / base:.2f}x")


if __name__ == "__main__":
    main()
