"""Perplexity of the default model on a text shipped in the repo, for each weight format.

    python -m engine.bench.perplexity [--formats gguf-bf16,dense-bf16,dense-f32] [--window 512]

`engine/bench/data/perplexity.txt` (about 1,200 tokens: public-domain prose by Austen, Lincoln
and Dickens, and a few plain paragraphs on programs and science) is cut into windows of
`--window` tokens, each scored on its own: the model reads the window once (a prefill through
the engine's own runner and attention) and every next token's log-probability is taken from the
logits at the position before it. Perplexity = exp(mean negative log-likelihood).

Formats:
  gguf-bf16   the default: the GGUF's Q4_1 / Q8_0 codes, bfloat16 activations, every row
              through the codes (as decode steps meet them; a long prefill would otherwise take
              the dense weights above the crossover)
  gguf-int8   the default's batch path: every row as int8 activations (per group of 32) x the
              codes re-quantized to int8 per output channel (a step above the codes' crossover)
  gguf-q4-int8  --batch-linear int8 below the crossover: the Q4_1 codes against int8
              activations at every row, the Q8_0 LM head on its exact codes
  gguf-f32    the same codes with float32 activations
  dense-bf16  --quantization none: the weights rounded to bfloat16
  dense-int8  --quantization int8: the dense weights as int8 per output channel x int8 activations
  dense-f32   --quantization none, float32: the exact weights in float32, the reference
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.core.outputs import NewRequestData, SchedulerOutput
from engine.core.request import Request
from engine.llm_engine import LLMEngine
from engine.models.group_quantized import GroupQuantizedMethod
from engine.runner.model_runner import ModelRunner

TEXT = Path(__file__).with_name("data") / "perplexity.txt"
FORMATS = {  # name -> (--quantization, --dtype)
    "gguf-bf16": ("gguf", "bfloat16"),
    "gguf-int8": ("gguf", "bfloat16"),
    "gguf-q4-int8": ("gguf", "bfloat16"),
    "gguf-f32": ("gguf", "float32"),
    "dense-bf16": ("none", "bfloat16"),
    "dense-int8": ("int8", "bfloat16"),
    "dense-f32": ("none", "float32"),
}


def build_engine(fmt: str, window: int) -> LLMEngine:
    quantization, dtype = FORMATS[fmt]
    engine = LLMEngine(EngineConfig(device="cpu", kv_cache_memory=64 << 20, max_model_len=max(window, 64),
                                    max_num_batched_tokens=max(window, 64), quantization=quantization, dtype=dtype,
                                    batch_linear="int8" if fmt in ("gguf-int8", "gguf-q4-int8") else "auto"))
    for module in engine.model.modules():
        method = getattr(module, "method", None)
        if isinstance(method, GroupQuantizedMethod):
            # every row through the int8 batch method, else through the codes (gguf-q4-int8: against
            # int8 activations, but the Q8_0 LM head on its exact codes: it has no such path)
            method.max_rows = 0 if fmt == "gguf-int8" else 1 << 30
    return engine


def text_token_ids(engine: LLMEngine) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(engine.model_dir))
    return tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"]


def window_nll(engine: LLMEngine, ids: list[int], request_id: str) -> tuple[float, int]:
    """(sum of -log p(ids[i+1] | ids[..i]), number of predicted tokens) over one window, in one
    prefill step through the engine's runner; the window's KV blocks are released after."""
    request = Request(request_id, ids, SamplingParams(max_tokens=1), 1)
    assert engine.block_manager.allocate(request, len(ids)) == len(ids), "KV cache too small for one window"
    runner = engine.runner
    assert isinstance(runner, ModelRunner)
    step = SchedulerOutput([NewRequestData(request_id, list(ids), len(ids), request.params, list(request.block_ids),
                                           0)], [], {request_id: len(ids)})
    with torch.inference_mode():
        runner.update_states(step)
        hidden = runner.forward(runner.prepare_inputs(step))  # [len(ids), hidden]
        logits = engine.model.compute_logits(hidden[:-1])
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        nll = -logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).sum().item()
    runner.update_states(SchedulerOutput([], [], {}, finished_request_ids={request_id}))
    engine.block_manager.free(request)
    return nll, len(ids) - 1


def perplexity(fmt: str, window: int = 512) -> float:
    engine = build_engine(fmt, window)
    ids = text_token_ids(engine)
    total, count = 0.0, 0
    for i, start in enumerate(range(0, len(ids) - 1, window)):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        nll, n = window_nll(engine, chunk, f"ppl-{i}")
        total, count = total + nll, count + n
    return math.exp(total / count)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="gguf-bf16,gguf-int8,gguf-q4-int8,gguf-f32,dense-bf16,dense-int8,dense-f32")
    ap.add_argument("--window", type=int, default=512)
    args = ap.parse_args(argv)
    results = {fmt: perplexity(fmt, args.window) for fmt in args.formats.split(",")}
    reference = results.get("dense-f32")
    print(f"perplexity of {TEXT.name}, windows of {args.window} tokens")
    print(f"{'format':12s} {'perplexity':>10s} {'vs dense-f32':>13s}")
    for fmt, value in results.items():
        ratio = f"{(value / reference - 1) * 100:+.2f} %" if reference else ""
        print(f"{fmt:12s} {value:10.4f} {ratio:>13s}")


if __name__ == "__main__":
    main()
