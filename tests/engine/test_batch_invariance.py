"""Batch-invariant decoding: a request that asks for it gets bitwise the same logits (seen through
its logprobs, computed from the whole logits row) and tokens alone and inside any batch.

The reference is each request alone, its prompt prefilled whole. Against it: random batches of 1
to 32 requests (other batch-invariant ones and ordinary ones, of other lengths, joining at
random steps), with prefill chunks of 7 and 64 tokens and whole prompts, in float32 and bfloat16,
greedy and seeded sampling. The pieces are tested on their own too: the attention against plain
softmax attention and in random batches, and the fixed-tile linear path through a matmul whose
result does depend on the batch size (MKL's float32 GEMM).
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.messages import SamplingParams
from engine.attention.batch_invariant import batch_invariant_attention, build_invariant_rows
from engine.llm import LLM
from engine.models.batch_invariance import TILE_ROWS, apply_in_tiles, probe_min_rows
from engine.models.group_quantized import GroupQuantizedMethod

pytestmark = pytest.mark.slow  # random batches of up to 32 requests, in two dtypes

TOPICS = ["the sea", "a cat who reads maps", "coffee", "rain on a tin roof at night", "music", "old books",
          "trains crossing a bridge in winter", "the moon"]
MAX_TOKENS = 10
KV_BYTES = 256 << 20  # ~5,800 float32 tokens: 32 requests of under 100 tokens each


def _chat(llm: LLM, topic: str) -> list[int]:
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": f"Write one sentence about {topic}."}],
                                             tokenize=False, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def _invariant_params(i: int) -> SamplingParams:
    if i % 2 == 0:
        return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=20, batch_invariant=True)
    return SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i, max_tokens=MAX_TOKENS, logprobs=20,
                          batch_invariant=True)


def _run(llm: LLM, requests: list[tuple[int, list[int], SamplingParams]]) -> dict[str, tuple]:
    """requests: (arrival step, prompt ids, params), ids "r<index>". Returns per id (tokens,
    logprobs as (id, value) pairs per token)."""
    engine = llm.engine
    pending = sorted(range(len(requests)), key=lambda i: requests[i][0])
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(requests))}
    logprobs: dict[str, list] = {f"r{i}": [] for i in range(len(requests))}
    step = 0
    while pending or engine.has_unfinished():
        while pending and requests[pending[0]][0] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", requests[i][1], requests[i][2])
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
            if delta.logprobs:
                logprobs[delta.request_id].extend([(e.token_id, e.logprob) for e in entry] for entry in delta.logprobs)
        step += 1
    return {r: (tokens[r], logprobs[r]) for r in tokens}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def reference(dtype):
    """Each batch-invariant request alone, whole prompts."""
    llm = LLM(dtype=dtype, max_num_batched_tokens=2048, max_model_len=2048, kv_cache_memory=KV_BYTES)
    prompts = [_chat(llm, t) for t in TOPICS]
    alone = {}
    for i, prompt in enumerate(prompts):
        alone[i] = _run(llm, [(0, prompt, _invariant_params(i))])["r0"]
    return prompts, alone


@pytest.mark.parametrize("chunk", [7, 64, 2048])
def test_alone_equals_inside_random_batches(dtype, reference, chunk):
    prompts, alone = reference
    llm = LLM(dtype=dtype, max_num_batched_tokens=chunk, max_model_len=2048, kv_cache_memory=KV_BYTES)
    rng = random.Random(chunk)
    for batch_size in (32, rng.randint(2, 31)):
        requests, tracked = [], {}
        for slot in range(batch_size):
            i = slot % len(prompts)
            if slot < len(prompts) or rng.random() < 0.3:  # every invariant request, then some again
                tracked[f"r{len(requests)}"] = i
                requests.append((rng.randint(0, 6), prompts[i], _invariant_params(i)))
            else:  # ordinary requests of other lengths and sampling
                cut = rng.randint(5, len(prompts[i]))
                params = SamplingParams(temperature=rng.choice([0, 1.0]), max_tokens=rng.randint(1, 2 * MAX_TOKENS),
                                        seed=rng.randint(0, 99))
                requests.append((rng.randint(0, 6), prompts[i][:cut], params))
        got = _run(llm, requests)
        for request_id, i in tracked.items():
            tokens, logprobs = got[request_id]
            assert tokens == alone[i][0], f"{dtype}, chunk {chunk}, batch {batch_size}: tokens of prompt {i}"
            assert logprobs == alone[i][1], f"{dtype}, chunk {chunk}, batch {batch_size}: logprobs of prompt {i}"


def test_alone_equals_batch_of_one_request_at_a_time(dtype, reference):
    """The lone-row path (one decode row in the step) against rows among others: the first
    request alone vs. joining a batch that is already decoding."""
    prompts, alone = reference
    llm = LLM(dtype=dtype, max_num_batched_tokens=64, max_model_len=2048, kv_cache_memory=KV_BYTES)
    requests = [(0, prompts[1], _invariant_params(1)), (3, prompts[0], _invariant_params(0))]
    got = _run(llm, requests)
    assert got["r0"] == alone[1] and got["r1"] == alone[0]


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_attention_matches_softmax_and_ignores_the_batch(dtype_name):
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    kv_heads, num_blocks, block_size, head_dim, heads = 3, 200, 16, 64, 9
    k_cache = torch.randn(kv_heads, num_blocks, block_size, head_dim).to(dtype)
    v_cache = torch.randn(kv_heads, num_blocks, block_size, head_dim).to(dtype)
    table = torch.randperm(num_blocks)[:40].int()
    query = torch.randn(heads, head_dim).to(dtype)

    def attend(queries, positions, tables):
        rows = build_invariant_rows(0, np.array(positions), np.arange(len(positions)), tables, block_size,
                                    torch.device("cpu"))
        return batch_invariant_attention(queries, k_cache, v_cache, rows, head_dim ** -0.5)

    position = 100
    alone = attend(query[None], [position], table[None])[0]
    keys = k_cache[:, table].reshape(kv_heads, -1, head_dim)[:, : position + 1].double()
    values = v_cache[:, table].reshape(kv_heads, -1, head_dim)[:, : position + 1].double()
    q = query.double().view(kv_heads, heads // kv_heads, head_dim)
    plain = torch.softmax(q @ keys.transpose(1, 2) * head_dim ** -0.5, -1) @ values
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(alone.double().view_as(plain), plain, atol=tolerance, rtol=tolerance)
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        positions = rng.integers(0, 600, n)
        at = int(rng.integers(n))
        positions[at] = position
        queries = torch.randn(n, heads, head_dim).to(dtype)
        queries[at] = query
        tables = torch.stack([torch.randperm(num_blocks)[:40].int() for _ in range(n)])
        tables[at] = table
        assert torch.equal(attend(queries, list(positions), tables)[at], alone)


def test_fixed_tiles_make_a_batch_size_dependent_matmul_invariant():
    """MKL's float32 GEMM sums a row differently by batch size (the probe sees it); through
    fixed tiles every row comes out the same in any batch, after any rows."""
    torch.manual_seed(0)
    weight = torch.randn(576, 1536)

    def apply(x):
        return F.linear(x, weight)

    assert probe_min_rows(apply, 1536, torch.float32, torch.device("cpu"), 64) is None
    x = torch.randn(40, 1536)
    first_row = [apply(x[:size])[0] for size in (1, 2, 3, 4, 8, 40)]
    assert any(not torch.equal(row, first_row[0]) for row in first_row), "the kernel should depend on the batch"
    tiled = apply_in_tiles(apply, x, 0)
    for head in range(0, 9):  # ordinary rows before the invariant ones
        for offset in range(TILE_ROWS + 1):  # other invariant rows before these
            for tail in (1, 2, TILE_ROWS, TILE_ROWS + 1, 37):
                rows = torch.cat((torch.randn(head + offset, 1536), x[:tail]))
                assert torch.equal(apply_in_tiles(apply, rows, head)[head + offset:], tiled[:tail])


def test_speculative_decoding_keeps_the_logits(dtype, reference):
    """Verifying an n-gram draft attends several rows of a request in one step; each row still
    gives the logits it gives one token at a time, so greedy outputs and their logprobs equal the
    reference without speculation. (Seeded sampling is not compared: accepting or rejecting a
    sampled draft draws its random numbers differently, by design.)"""
    prompts, alone = reference
    llm = LLM(dtype=dtype, max_num_batched_tokens=512, max_model_len=2048, kv_cache_memory=KV_BYTES,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 3})
    got = _run(llm, [(0, prompt, _invariant_params(i)) for i, prompt in enumerate(prompts)])
    spec = llm.engine.scheduler.speculator.take_stats()
    assert spec is not None and spec.num_accepted_tokens > 0, "drafts should have been verified and accepted"
    for i in range(0, len(prompts), 2):  # the greedy ones
        assert got[f"r{i}"] == alone[i], f"{dtype}: prompt {i} with speculative decoding"


def test_invariant_rows_do_not_depend_on_the_timed_crossover():
    """Up to how many rows the GGUF codes run is timed at start-up, so two engines may differ:
    an invariant request alone in one engine and in a batch in another must still get the same
    bits, with the codes' crossover at 0 rows in one (dense above every tile) and 16 in the other."""
    results = []
    for max_rows in (0, 16):
        llm = LLM(dtype="bfloat16", max_num_batched_tokens=64, max_model_len=2048, kv_cache_memory=KV_BYTES)
        for module in llm.engine.model.modules():
            if isinstance(getattr(module, "method", None), GroupQuantizedMethod):
                module.method.max_rows = max_rows
        prompt = _chat(llm, TOPICS[0])
        others = [(step, _chat(llm, TOPICS[i])[: 20 + 9 * i], SamplingParams(temperature=0, max_tokens=12))
                  for step, i in ((0, 1), (1, 2), (1, 3), (2, 4))]
        requests = [(0, prompt, _invariant_params(0))] + (others if max_rows else [])
        results.append(_run(llm, requests)["r0"])
    assert results[0] == results[1]
