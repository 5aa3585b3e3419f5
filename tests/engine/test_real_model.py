"""The engine on the real default model (SmolLM2-135M-Instruct, fp32) against transformers."""
from __future__ import annotations

import pytest
import torch
from real_prompts import QUESTIONS
from transformers import AutoModelForCausalLM

from engine.llm import LLM
from common.messages import SamplingParams

pytestmark = pytest.mark.slow  # the real model against transformers.generate



@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", device="cpu", kv_cache_memory=256 << 20, max_model_len=1024, max_num_seqs=32)


@pytest.fixture(scope="module")
def chat_prompts(llm):
    tok = llm.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]


def test_greedy_equals_transformers_generate(llm, chat_prompts):
    """All five prompts run batched in our engine; each is compared with transformers alone."""
    params = SamplingParams(temperature=0, max_tokens=32, min_tokens=32)
    ours = llm.generate(chat_prompts, params)
    hf = AutoModelForCausalLM.from_pretrained(str(llm.engine.model_dir), dtype=torch.float32).eval()
    for prompt, out in zip(chat_prompts, ours, strict=True):
        ids = torch.tensor([out.prompt_token_ids])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False)[0, ids.shape[1]:].tolist()
        assert out.outputs[0].token_ids == ref, f"prompt {prompt!r}"
    assert "北京" in ours[2].outputs[0].text


def test_seed_gives_same_tokens_alone_and_in_batch_of_32(llm, chat_prompts):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24)
    alone = llm.generate([chat_prompts[1]], seeded)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=24 + i % 5) for i in range(31)]
    batch_prompts = [chat_prompts[i % 5] for i in range(31)]
    batch = llm.generate(batch_prompts[:17] + [chat_prompts[1]] + batch_prompts[17:],
                         others[:17] + [seeded] + others[17:])
    assert batch[17].outputs[0].token_ids == alone
    unseeded = {tuple(o.outputs[0].token_ids) for o in batch[:5]}
    assert len(unseeded) > 1  # sampling does sample


def test_n_choices_logprobs_and_prefix_cache(llm, chat_prompts):
    out = llm.generate(chat_prompts[0], SamplingParams(temperature=0.8, n=3, seed=7, max_tokens=8, logprobs=2))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids)
        assert all(len(entry) == 3 and entry[0].token_id == t for entry, t in zip(c.logprobs, c.token_ids, strict=True))
        assert all(entry[0].logprob <= 0 for entry in c.logprobs)
    again = llm.generate(chat_prompts[0], SamplingParams(temperature=0, max_tokens=4))[0]
    assert again.num_cached_tokens >= 16 * (len(again.prompt_token_ids) // 16 - 1)


def test_stop_token_ids_and_ignore_eos(llm, chat_prompts):
    free = llm.generate(chat_prompts[0], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0]
    assert free.finish_reason == "stop" and free.token_ids[-1] == 2  # <|im_end|> is EOS
    stop_at = free.token_ids[2]
    cut = llm.generate(chat_prompts[0], SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_at]))[0]
    assert cut.outputs[0].token_ids == free.token_ids[:3] and cut.outputs[0].stop_reason == stop_at
    longer = llm.generate(chat_prompts[0], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert len(longer.outputs[0].token_ids) == 40 and longer.outputs[0].finish_reason == "length"


TOPICS = ["the ocean", "a forest", "the moon", "coffee", "a city at night", "winter", "music", "a library",
          "the desert", "friendship"]
FORMS = ["Describe {} in one sentence.", "Write a haiku about {}.", "Give three facts about {}.",
         "What is the best thing about {}?", "Explain {} to a child."]


@pytest.fixture(scope="module")
def bf16_llm():
    # No prefix cache: each run must batch and chunk its prompts alike, since bfloat16 results
    # depend on the batch shape.
    return LLM(dtype="bfloat16", device="cpu", kv_cache_memory=256 << 20, max_model_len=512, max_num_seqs=64,
               enable_prefix_caching=False)


def test_bf16_top_k_1_and_tiny_top_p_give_the_greedy_text(bf16_llm):
    """bfloat16 logits tie often; every path must break ties the same way (lowest id), so top_k=1
    and a tiny top_p give exactly the greedy text, and the greedy token is always the first
    top_logprobs entry (50 chat prompts, 24 tokens each)."""
    tok = bf16_llm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": form.format(topic)}], tokenize=False,
                                       add_generation_prompt=True) for form in FORMS for topic in TOPICS]
    assert len(prompts) == 50
    greedy = bf16_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, logprobs=3))
    for params in (SamplingParams(temperature=1.0, top_k=1, max_tokens=24, seed=5),
                   SamplingParams(temperature=1.0, top_p=1e-9, max_tokens=24)):
        other = bf16_llm.generate(prompts, params)
        for g, o in zip(greedy, other, strict=True):
            assert o.outputs[0].token_ids == g.outputs[0].token_ids, params
    for g in greedy:
        for token, entry in zip(g.outputs[0].token_ids, g.outputs[0].logprobs, strict=True):
            assert entry[0].token_id == token and entry[1].token_id == token
