"""Perplexity of the default model on a text shipped in the repo, for each weight format.

    python -m benchmarks.perplexity [--formats gguf-bf16,dense-bf16,dense-f32] [--window 512]
                                      [--kv-cache-dtypes auto,int8] [--chunk 1]

`benchmarks/data/perplexity.txt` (about 3,600 tokens: public-domain prose and verse by Austen,
Lincoln, Dickens, Melville, Carroll, Shakespeare, Jefferson, Shelley and Poe, plain paragraphs on
programs, science and everyday things, and two short Python programs) is cut into windows of
`--window` tokens, each scored on its own: the model reads the window once (a prefill through
the engine's own runner and attention) and every next token's log-probability is taken from the
logits at the position before it. Perplexity = exp(mean negative log-likelihood).

A whole window in one prefill attends this step's K/V, never the cache's. `--chunk N` feeds each
window N tokens per step instead, so every step attends the keys before it from the KV cache as
stored (`--chunk 1`: every token a one-query step, through the decode kernel, as generation reads
the cache); with `--kv-cache-dtypes auto,int8` each format runs with each cache dtype.

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
from engine.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
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


def build_engine(fmt: str, window: int, kv_cache_dtype: str = "auto") -> LLMEngine:
    quantization, dtype = FORMATS[fmt]
    engine = LLMEngine(EngineConfig(device="cpu", kv_cache_memory=64 << 20, max_model_len=max(window, 64),
                                    max_num_batched_tokens=max(window, 64), quantization=quantization, dtype=dtype,
                                    batch_linear="int8" if fmt in ("gguf-int8", "gguf-q4-int8") else "auto",
                                    kv_cache_dtype=kv_cache_dtype))
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


def window_nll(engine: LLMEngine, ids: list[int], request_id: str, chunk: int | None = None) -> tuple[float, int]:
    """(sum of -log p(ids[i+1] | ids[..i]), number of predicted tokens) over one window, through the
    engine's runner in steps of `chunk` tokens (None: one prefill step); the window's KV blocks
    are released after."""
    request = Request(request_id, ids, SamplingParams(max_tokens=1), 1)
    assert engine.block_manager.allocate(request, len(ids)) == len(ids), "KV cache too small for one window"
    runner = engine.runner
    assert isinstance(runner, ModelRunner)
    chunk = chunk or len(ids)
    hidden_parts = []
    with torch.inference_mode():
        for done in range(0, len(ids), chunk):
            n = min(chunk, len(ids) - done)
            if done == 0:
                step = SchedulerOutput([NewRequestData(request_id, list(ids), len(ids), request.params,
                                                       list(request.block_ids), 0)], [], {request_id: n})
            else:
                step = SchedulerOutput([], [CachedRequestData(request_id, [], done)], {request_id: n})
            runner.update_states(step)
            hidden_parts.append(runner.forward(runner.prepare_inputs(step)))  # [n, hidden]
        logits = engine.model.compute_logits(torch.cat(hidden_parts)[:-1])
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        nll = -logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).sum().item()
    runner.update_states(SchedulerOutput([], [], {}, finished_request_ids={request_id}))
    engine.block_manager.free(request)
    return nll, len(ids) - 1


def perplexity(fmt: str, window: int = 512, kv_cache_dtype: str = "auto", chunk: int | None = None,
               max_tokens: int | None = None) -> float:
    """Over the text's first `max_tokens` tokens (None: all of it)."""
    return engine_perplexity(build_engine(fmt, window, kv_cache_dtype), window, chunk, max_tokens)


def engine_perplexity(engine: LLMEngine, window: int = 512, chunk: int | None = None,
                      max_tokens: int | None = None) -> float:
    """perplexity() on an engine from build_engine(), which may score the text again."""
    ids = text_token_ids(engine)[:max_tokens]
    total, count = 0.0, 0
    for i, start in enumerate(range(0, len(ids) - 1, window)):
        piece = ids[start:start + window]
        if len(piece) < 2:
            break
        nll, n = window_nll(engine, piece, f"ppl-{i}", chunk)
        total, count = total + nll, count + n
    return math.exp(total / count)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="gguf-bf16,gguf-int8,gguf-q4-int8,gguf-f32,dense-bf16,dense-int8,dense-f32")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--kv-cache-dtypes", default="auto", help="comma-separated: auto, int8")
    ap.add_argument("--chunk", type=int, default=None, help="tokens per step (default: each window in one step)")
    ap.add_argument("--max-tokens", type=int, default=None, help="score only the text's first N tokens")
    args = ap.parse_args(argv)
    results = {(fmt, kv): perplexity(fmt, args.window, kv, args.chunk, args.max_tokens)
               for fmt in args.formats.split(",") for kv in args.kv_cache_dtypes.split(",")}
    reference = results.get(("dense-f32", "auto"))
    steps = "one step per window" if args.chunk is None else f"{args.chunk} tokens per step"
    print(f"perplexity of {TEXT.name}, windows of {args.window} tokens, {steps}")
    print(f"{'format':12s} {'KV cache':>8s} {'perplexity':>10s} {'vs dense-f32':>13s}")
    for (fmt, kv), value in results.items():
        ratio = f"{(value / reference - 1) * 100:+.2f} %" if reference else ""
        print(f"{fmt:12s} {kv:>8s} {value:10.4f} {ratio:>13s}")

if __name__ == "__main__":
    main()
