"""n-gram speculative decoding through the real runner and sampler: greedy output is token for
token what it is without speculation (real model, fp32), and sampled output keeps its
distribution (real model, two-sample chi-square on the positions that drafts covered)."""
from __future__ import annotations

from collections import Counter

import pytest

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from common.speculative_config import SpeculativeConfig
from benchmarks.grounded import grounded_messages
from engine.llm import LLM
from engine.llm_engine import LLMEngine

pytestmark = pytest.mark.slow  # thousands of sampled draws, and the real model

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
        "disable_by_batch_size": 16}
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "请用中文介绍一下北京。",
             "List three prime numbers and explain why they are prime.", "def fibonacci(n):"]


def chat_prompts(llm: LLM) -> list[str]:
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS] + grounded_messages()
    return [llm.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]


def test_greedy_output_is_unchanged_by_speculation():
    common = dict(dtype="float32", device="cpu", kv_cache_memory=256 << 20, max_model_len=1024, max_num_seqs=16)
    plain = LLM(**common)
    spec = LLM(**common, speculative_config=SPEC)
    prompts = chat_prompts(plain)
    params = SamplingParams(temperature=0, max_tokens=48, logprobs=1)
    want = plain.generate(prompts, params)
    got = spec.generate(prompts, params)
    for p, w, g in zip(prompts, want, got, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids, p[-200:]
        assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
        assert [e[0].token_id for e in g.outputs[0].logprobs] == g.outputs[0].token_ids
        for a, b in zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True):
            assert a[0].logprob == pytest.approx(b[0].logprob, abs=1e-3)
    stats = spec.engine.scheduler.speculator.take_stats()
    assert stats is not None and stats.num_accepted_tokens > 0.3 * stats.num_draft_tokens, stats


def _two_sample_chi_square(a: Counter, b: Counter) -> tuple[float, int]:
    """Statistic and degrees of freedom over the tokens seen at least 10 times in all (the rest pooled)."""
    n_a, n_b = sum(a.values()), sum(b.values())
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rest_a, rest_b = n_a - sum(a[k] for k in keys), n_b - sum(b[k] for k in keys)
    cells = [(a[k], b[k]) for k in keys] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    stat = 0.0
    for x, y in cells:
        total = x + y
        ex, ey = total * n_a / (n_a + n_b), total * n_b / (n_a + n_b)
        stat += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey
    return stat, len(cells) - 1


def test_sampled_distribution_is_kept():
    """The real model copying a text (so drafts exist and are mostly accepted), temperature 0.8:
    the distribution of each of the first output positions with and without speculation agrees
    (two-sample chi-square at p = 0.001; 400 independent seeded requests per side)."""
    tok_llm = LLM(dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20, max_model_len=1024)
    prompt = tok_llm.tokenizer.encode(chat_prompts(tok_llm)[len(QUESTIONS)], add_special_tokens=False)
    runs = {}
    for name, spec in (("plain", None), ("spec", SpeculativeConfig(**{**SPEC, "disable_by_batch_size": 64}))):
        engine = LLMEngine(EngineConfig(dtype="bfloat16", device="cpu", kv_cache_memory=256 << 20, max_model_len=1024,
                                        max_num_seqs=64, speculative_config=spec))
        tokens: dict[str, list[int]] = {}
        for i in range(400):
            engine.add_request(str(i), prompt, SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True,
                                                              seed=i + (0 if spec else 10**6)))
        while engine.has_unfinished():
            for d in engine.step():
                tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
        runs[name] = list(tokens.values())
        if spec:
            stats = engine.scheduler.speculator.take_stats()
            assert stats is not None and stats.num_accepted_tokens > 0.5 * stats.num_draft_tokens, stats
    # critical values of chi-square at p = 0.001 (df -> value), interpolated for larger df
    for position in range(1, 6):
        a = Counter(t[position] for t in runs["plain"])
        b = Counter(t[position] for t in runs["spec"])
        stat, df = _two_sample_chi_square(a, b)
        critical = df + 3.1 * (2 * df) ** 0.5 + 6  # above the 0.999 quantile for every df >= 1
        assert stat < critical, (position, stat, df)
