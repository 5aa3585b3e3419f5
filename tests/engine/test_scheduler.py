"""Scheduler and block manager on CPU with a fake runner (no model): budgets, leaks, prefix
cache hits, preemption by recompute."""
from __future__ import annotations

import random

import pytest

from engine.block_manager import BlockManager
from common.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from common.messages import SamplingParams
from engine.request import Request
from engine.sampler import SamplerOutput


class FakeRunner:
    """Next token = a fixed function of the whole history, so a recomputed request must give the
    same tokens as one that ran straight through. Records what each step scheduled."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.steps: list[list[tuple[str, int, int]]] = []  # (id, num_computed_before, num_new)

    def execute(self, batch):
        self.steps.append([(r.request_id, r.num_computed_tokens, n) for r, n in batch.entries])
        for r, n in batch.entries:
            assert r.num_computed_tokens + n <= r.num_tokens
            assert len(r.block_ids) * 16 >= r.num_computed_tokens + n, "slots for every scheduled token"
        done = [r for r, n in batch.entries if r.num_computed_tokens + n == r.num_tokens]
        tokens = [3 + (sum(r.all_token_ids) * 31 + len(r.all_token_ids)) % (self.vocab_size - 3) for r in done]
        return done, SamplerOutput(tokens, [None] * len(done))


@pytest.fixture
def engine(tiny_llama_dir):
    def build(**kw):
        values = dict(model=tiny_llama_dir, dtype="float32", device="cpu", block_size=16, max_model_len=256,
                      max_num_batched_tokens=64, max_num_seqs=8, kv_cache_memory=None)
        values.update(kw)
        cfg = EngineConfig(**values)
        if cfg.kv_cache_memory is None:
            cfg = cfg.replace(kv_cache_memory=48 * 16 * 2 * 3 * 2 * 16 * 4)  # 48 blocks of the tiny model
        eng = LLMEngine(cfg)
        eng.runner = FakeRunner(eng.vocab_size)
        return eng
    return build


def run_all(eng):
    outputs: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for d in eng.step():
            outputs.setdefault(d.request_id, []).extend(d.new_token_ids)
    return outputs


def prompts(n, seed=0, lo=5, hi=120):
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 256) for _ in range(rnd.randrange(lo, hi))] for _ in range(n)]


def test_budget_never_exceeded_and_no_block_leaks(engine):
    eng = engine()
    for i, p in enumerate(prompts(12)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=20, ignore_eos=True))
    out = run_all(eng)
    assert all(len(v) == 20 for v in out.values()) and len(out) == 12
    for step in eng.runner.steps:
        assert sum(n for _, _, n in step) <= 64
        assert len(step) <= 8
    assert any(n > 1 and start > 0 for step in eng.runner.steps for _, start, n in step), "chunked prefill happened"
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert sum(eng.block_manager.ref_counts) == 0


def test_abort_frees_everything_at_once(engine):
    eng = engine()
    for i, p in enumerate(prompts(6, seed=1)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(5):
        eng.step()
    assert eng.block_manager.num_free_blocks < eng.block_manager.num_blocks
    for i in range(6):
        assert eng.abort(f"r{i}")
    assert not eng.abort("r0") and not eng.abort("unknown")  # late or duplicate aborts are harmless
    assert not eng.has_unfinished()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_preempted_request_resumes_to_same_output(engine):
    ps = prompts(6, seed=2, lo=40, hi=60)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    roomy = engine()
    for i, p in enumerate(ps):
        roomy.add_request(f"r{i}", p, params)
    expected = run_all(roomy)
    assert roomy.scheduler.num_preemptions == 0
    # 20 blocks of 16 cannot hold six sequences of ~110 tokens: preemption must happen.
    tight = engine(kv_cache_memory=20 * 16 * 2 * 3 * 2 * 16 * 4, max_model_len=128, enable_prefix_caching=False)
    for i, p in enumerate(ps):
        tight.add_request(f"r{i}", p, params)
    got = run_all(tight)
    assert tight.scheduler.num_preemptions > 0
    assert got == expected
    assert tight.block_manager.num_free_blocks == tight.block_manager.num_blocks


def test_repeated_prompt_hits_prefix_cache(engine):
    eng = engine()
    prompt = prompts(1, seed=3, lo=70, hi=71)[0]
    eng.add_request("a", prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    run_all(eng)
    eng.add_request("b", prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    deltas = []
    while eng.has_unfinished():
        deltas += eng.step()
    assert deltas[-1].num_cached_tokens == 64  # 4 full blocks of 16 out of 70 tokens
    first_b = next(step for step in eng.runner.steps if step[0][0] == "b")
    assert first_b == [("b", 64, 6)]
    assert eng.block_manager.prefix_hits == 64


def test_block_manager_lru_eviction_and_refcounts():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = Request("a", [1, 2, 3, 4, 5], SamplingParams(), 4, 0.0, None)
    assert bm.allocate(a, 5) == 5
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    b = Request("b", [1, 2, 3, 4, 9], SamplingParams(), 4, 0.0, None)
    assert bm.allocate(b, 5) == 1 and b.num_computed_tokens == 4  # shares both full blocks
    assert bm.ref_counts[a.block_ids[0]] == 2
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 4 and len(bm.hash_to_block) == 2
    c = Request("c", [7, 7, 7, 7, 7, 7, 7], SamplingParams(), 1, 0.0, None)
    assert bm.allocate(c, 7) == 7  # needs all 4 blocks: cached ones are evicted
    assert len(bm.hash_to_block) == 0
    assert bm.allocate(Request("d", [1], SamplingParams(), 1, 0.0, None), 1) is None


def test_finished_status_and_length_limit(engine):
    eng = engine(max_model_len=40)
    eng.add_request("a", list(range(3, 33)), SamplingParams(ignore_eos=True))  # max_tokens None: up to the limit
    out = run_all(eng)
    assert len(out["a"]) == 10
    with pytest.raises(ValueError, match="exceeds max_model_len 40"):
        eng.add_request("b", list(range(3, 33)), SamplingParams(max_tokens=11))
    assert not eng.requests and not eng.has_unfinished()
