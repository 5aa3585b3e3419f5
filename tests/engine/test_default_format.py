"""The default format (the GGUF's Q4_1 / Q8_0 codes, bfloat16 activations) against the dense paths.

- Perplexity on the shipped text (`python -m benchmarks.perplexity`): the codes, and the codes
  against int8 activations, within 1 % of the dense bfloat16 path's and of the exact float32
  model's; the int8 path that batches above the codes' crossover take within 1.5 % (it reads
  +1.0 %); the codes with float32 activations within 0.01 % of the float32 model (the same
  weights, other sums).
- Greedy tokens on the real-model test prompts, every decode row on the codes: they equal the
  exact float32 model's (transformers), or where they part, the exact model puts the two
  candidates within a near-tie: their logit gap is below 0.15 (bf16 activations round a logit of
  ~20 by ~0.08), and the test prints each flip with its gap.
"""
from __future__ import annotations

import functools

import pytest
import torch
from real_prompts import QUESTIONS
from transformers import AutoModelForCausalLM

from common.messages import SamplingParams
from benchmarks import perplexity as perplexity_tool
from engine.llm import LLM
from engine.models.group_quantized import GroupQuantizedMethod
from engine.models.native_decode import NativeDecodeLayers
from engine.native import kernels

pytestmark = [pytest.mark.skipif(kernels() is None, reason="the native CPU kernels could not be built here"),
              pytest.mark.slow]  # perplexity over the shipped text, several formats

NEAR_TIE = 0.15
# each format's perplexity once per session: both tests compare with the dense references
perplexity = functools.cache(perplexity_tool.perplexity)
CODES_ROWS = 8  # decode rows that run on the codes in the greedy test (every row of its batch)


def test_perplexity_of_the_codes_is_within_one_percent():
    codes, dense, exact = perplexity("gguf-bf16"), perplexity("dense-bf16"), perplexity("dense-f32")
    print(f"perplexity: gguf-bf16 {codes:.4f}, dense-bf16 {dense:.4f}, dense-f32 {exact:.4f}")
    assert abs(codes / dense - 1) < 0.01 and abs(codes / exact - 1) < 0.01
    assert abs(perplexity("gguf-f32") / exact - 1) < 1e-4


@pytest.mark.skipif(kernels() is None or not kernels().int8_linear_available(), reason="no AVX512-VNNI")
def test_perplexity_of_the_int8_paths():
    # The Q4_1 codes against int8 activations within 1 %. The default's batch path above the
    # crossover (the codes re-quantized to int8 per output channel, int8 activations) within 1.5 %:
    # on the 3,600-token text it reads +1.0 % of dense-bf16 and +1.05 % of float32, the same with
    # either prefill attention kernel (float32 FMAs or VDPBF16PS; on the earlier 1,200-token text
    # the two read -0.5 % and +1.2 % of dense-bf16: reordered float32 sums alone moved it that
    # much). --quantization int8 (dense weights re-quantized, lossy and opt-in) within 2 %.
    dense, exact = perplexity("dense-bf16"), perplexity("dense-f32")
    for fmt, bound in (("gguf-q4-int8", 0.01), ("gguf-int8", 0.015), ("dense-int8", 0.02)):
        int8 = perplexity(fmt)
        print(f"perplexity: {fmt} {int8:.4f}, dense-bf16 {dense:.4f}, dense-f32 {exact:.4f}")
        assert abs(int8 / dense - 1) < bound and abs(int8 / exact - 1) < bound


def _llm(quantization: str, batch_linear: str = "auto") -> LLM:
    return LLM(quantization=quantization, dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20,
               max_model_len=512, max_num_seqs=8, batch_linear=batch_linear)


def _greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=32, min_tokens=32)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_greedy_tokens_equal_the_exact_model_or_part_at_a_near_tie():
    # Every decode row on the codes: the crossover is pinned above the batch's five rows (the one
    # timed at start-up varies between machines and starts, and above it the rows would take the
    # batch method, which the perplexity tests above hold), and the one native call per decode step
    # is rebuilt so that it takes the pinned crossover too. The prompts' prefill takes the dense
    # batch method (the fastest one, also timed at start-up, would change the prefill's sums from
    # one start to the next). Against the exact model (transformers in float32, EOS banned for 32
    # tokens as min_tokens does), not against the dense bf16 path: both run bf16 activations, which
    # move a logit by up to ~0.3 here, so two bf16 paths can part from each other after both parted
    # from the exact model at a near-tie. (--quantization int8, lossy and opt-in, is held to its
    # perplexity instead: its greedy tokens part from bf16's at gaps up to ~0.5.)
    llm = _llm("gguf", batch_linear="dense")
    model = llm.engine.model
    for module in model.modules():
        if isinstance(getattr(module, "method", None), GroupQuantizedMethod):
            module.method.max_rows = CODES_ROWS
    if model.native_layers is not None:  # the one native call per decode step takes the crossovers when built
        model.native_layers = NativeDecodeLayers(model, kernels(), model.native_layers.kv_caches)
    tok = llm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in QUESTIONS]
    assert len(prompts) <= CODES_ROWS
    codes = _greedy(llm, prompts)
    hf = AutoModelForCausalLM.from_pretrained(str(llm.engine.model_dir), dtype=torch.float32).eval()
    equal = 0
    for prompt, ours in zip(prompts, codes, strict=True):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            exact = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False)
        exact_tokens = exact[0, len(ids):].tolist()
        if ours == exact_tokens:
            equal += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(ours, exact_tokens, strict=True)) if a != b)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + ours[:at]])).logits[0, -1]
        gap = (logits[exact_tokens[at]] - logits[ours[at]]).item()
        print(f"{prompt[-40:]!r}: tokens part at {at}: {ours[at]} vs exact {exact_tokens[at]}, "
              f"float32 logit gap {gap:.4f}")
        assert gap < NEAR_TIE, (prompt, at, gap)
    # Measured on the Intel Xeon: 3 of 5 equal; the others part at tokens 0 and 21 with gaps 0.082
    # and 0.066.
    assert equal >= 1, "no prompt gives the exact model's 32 tokens"
