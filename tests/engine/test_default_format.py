"""The default format (the GGUF's Q4_1 / Q8_0 codes, bfloat16 activations) against the dense paths.

- Perplexity on the shipped text (`python -m engine.bench.perplexity`): the codes, and the int8
  path that batches above the codes' crossover take, within 1 % of the dense bfloat16 path's, and
  of the exact float32 model's; the codes with float32 activations
  within 0.01 % of the float32 model (the same weights, other sums).
- Greedy tokens on the real-model test prompts: the codes equal the dense bfloat16 path's, or
  where they part, the exact float32 model (transformers, on the shared prefix) puts the two
  candidates within a near-tie: their logit gap is below 0.15 (bf16 activations round a logit of
  ~20 by ~0.08), and the test prints each flip with its gap.
"""
from __future__ import annotations

import pytest
import torch
from real_prompts import QUESTIONS
from transformers import AutoModelForCausalLM

from common.messages import SamplingParams
from engine.bench.perplexity import perplexity
from engine.llm import LLM
from engine.native import kernels

pytestmark = pytest.mark.skipif(kernels() is None, reason="the native CPU kernels could not be built here")

NEAR_TIE = 0.15


def test_perplexity_of_the_codes_is_within_one_percent():
    codes, dense, exact = perplexity("gguf-bf16"), perplexity("dense-bf16"), perplexity("dense-f32")
    print(f"perplexity: gguf-bf16 {codes:.4f}, dense-bf16 {dense:.4f}, dense-f32 {exact:.4f}")
    assert abs(codes / dense - 1) < 0.01 and abs(codes / exact - 1) < 0.01
    assert abs(perplexity("gguf-f32") / exact - 1) < 1e-4


@pytest.mark.skipif(kernels() is None or not kernels().int8_linear_available(), reason="no AVX512-VNNI")
def test_perplexity_of_the_int8_paths_is_within_one_percent():
    dense, exact = perplexity("dense-bf16"), perplexity("dense-f32")
    for fmt in ("gguf-int8", "gguf-q4-int8", "dense-int8"):  # the batch path; --batch-linear int8; --quantization int8
        int8 = perplexity(fmt)
        print(f"perplexity: {fmt} {int8:.4f}, dense-bf16 {dense:.4f}, dense-f32 {exact:.4f}")
        assert abs(int8 / dense - 1) < 0.01 and abs(int8 / exact - 1) < 0.01


def _llm(quantization: str) -> LLM:
    return LLM(quantization=quantization, dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20,
               max_model_len=512, max_num_seqs=8)


def _greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=32, min_tokens=32)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_greedy_tokens_equal_the_bf16_path_or_part_at_a_near_tie():
    # the codes up to the crossover, then the batch method (int8 where VNNI measures faster): the
    # five prompts run as one batch. (--quantization int8, lossy and opt-in, is held to its
    # perplexity instead: its greedy tokens part from bf16's at gaps up to ~0.5.)
    llm = _llm("gguf")
    tok = llm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in QUESTIONS]
    codes = _greedy(llm, prompts)
    dense = _greedy(_llm("none"), prompts)
    hf = AutoModelForCausalLM.from_pretrained(str(llm.engine.model_dir), dtype=torch.float32).eval()
    equal = 0
    for prompt, ours, theirs in zip(prompts, codes, dense, strict=True):
        if ours == theirs:
            equal += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        ids = tok(prompt, add_special_tokens=False)["input_ids"] + ours[:at]
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        gap = (logits[ours[at]] - logits[theirs[at]]).abs().item()
        print(f"{prompt[-40:]!r}: tokens part at {at}: {ours[at]} vs {theirs[at]}, float32 logit gap {gap:.4f}")
        assert gap < NEAR_TIE, (prompt, at, gap)
    # Measured here: 2 of 5 equal; the other 3 part at tokens 17-21 with gaps 0.03-0.07.
    assert equal >= 1, "no prompt gives the same 32 tokens"
