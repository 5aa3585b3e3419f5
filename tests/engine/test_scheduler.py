"""Scheduler and block manager on CPU with a fake runner and no model: budgets, leaks, prefix
cache hits, preemption by recompute."""
from __future__ import annotations

import random

import pytest

from common.messages import SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.engine_core import EngineCore
from engine.core.outputs import RunnerOutput, SchedulerOutput
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from scheduler_mirror import SchedulerMirror

VOCAB = 256
BLOCK_SIZE = 16


class FakeRunner:
    """Next token = a fixed function of the whole history, so a recomputed request must give the
    same tokens as one that ran straight through. It keeps its own copy of each request's state
    from the scheduler's structs only, as the real runner does. Records what each step scheduled."""

    def __init__(self, vocab_size: int, block_size: int):
        self.vocab_size, self.block_size = vocab_size, block_size
        self.steps: list[list[tuple[str, int, int]]] = []  # (id, num_computed_before, num_new)
        self.mirror = SchedulerMirror()
        self.tokens, self.blocks, self.computed = self.mirror.tokens, self.mirror.blocks, self.mirror.computed

    def execute(self, so: SchedulerOutput) -> RunnerOutput:
        self.mirror.apply(so)
        self.steps.append([(rid, self.computed[rid], n) for rid, n in so.num_scheduled_tokens.items()])
        done, sampled = [], []
        for rid, n in so.num_scheduled_tokens.items():
            tokens, computed = self.tokens[rid], self.computed[rid]
            assert computed + n <= len(tokens)
            assert len(self.blocks[rid]) * self.block_size >= computed + n, "slots for every scheduled token"
            if computed + n == len(tokens):
                token = 3 + (sum(tokens) * 31 + len(tokens)) % (self.vocab_size - 3)
                tokens.append(token)
                done.append(rid)
                sampled.append([token])
        return RunnerOutput(done, sampled)


@pytest.fixture
def engine():
    def build(num_blocks=48, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8,
              enable_prefix_caching=True):
        bm = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching)
        scheduler = Scheduler(bm, max_num_seqs, max_num_batched_tokens, max_model_len, eos_token_ids={2})
        return EngineCore(scheduler, FakeRunner(VOCAB, BLOCK_SIZE), VOCAB, max_model_len)
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
    tight = engine(num_blocks=20, max_model_len=128, enable_prefix_caching=False)
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
    assert deltas[0].num_cached_tokens == 64  # 4 full blocks of 16 out of 70 tokens (sent on the first delta)
    first_b = next(step for step in eng.runner.steps if step[0][0] == "b")
    assert first_b == [("b", 64, 6)]
    assert eng.block_manager.prefix_hits == 64


def test_block_manager_lru_eviction_and_refcounts():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = Request("a", [1, 2, 3, 4, 5], SamplingParams(), 4)
    assert bm.allocate(a, 5) == 5
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    b = Request("b", [1, 2, 3, 4, 9], SamplingParams(), 4)
    assert bm.allocate(b, 5) == 1 and b.num_computed_tokens == 4  # shares both full blocks
    assert bm.ref_counts[a.block_ids[0]] == 2
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 4 and len(bm.hash_to_block) == 2
    c = Request("c", [7, 7, 7, 7, 7, 7, 7], SamplingParams(), 1)
    assert bm.allocate(c, 7) == 7  # needs all 4 blocks: cached ones are evicted
    assert len(bm.hash_to_block) == 0
    assert bm.allocate(Request("d", [1], SamplingParams(), 1), 1) is None


def test_finished_status_and_length_limit(engine):
    eng = engine(max_model_len=40)
    eng.add_request("a", list(range(3, 33)), SamplingParams(ignore_eos=True))  # max_tokens None: up to the limit
    out = run_all(eng)
    assert len(out["a"]) == 10
    with pytest.raises(ValueError, match="exceeds max_model_len 40"):
        eng.add_request("b", list(range(3, 33)), SamplingParams(max_tokens=11))
    assert not eng.requests and not eng.has_unfinished()


def test_scheduling_layer_imports_no_torch():
    """engine.core (requests, block manager, scheduler, step structs) runs without torch, so it
    can be tested, and could run, apart from the model."""
    import subprocess
    import sys

    code = ("import sys, engine.core.engine_core, engine.core.scheduler, engine.core.outputs; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_resumed_request_is_not_a_prefix_cache_hit(engine):
    """A request preempted before its first token finds its own blocks in the prefix cache when it
    resumes: that must not count as cached prompt tokens (usage) or as hits (metrics)."""
    eng = engine(num_blocks=20, max_model_len=128, max_num_batched_tokens=256)
    for i, p in enumerate(prompts(6, seed=4, lo=40, hi=60)):  # distinct random prompts: nothing to share
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=60, ignore_eos=True))
    first_deltas = {}
    while eng.has_unfinished():
        for d in eng.step():
            first_deltas.setdefault(d.request_id, d)
    assert eng.scheduler.num_preemptions > 0
    assert all(d.num_cached_tokens == 0 for d in first_deltas.values())
    assert eng.block_manager.prefix_hits == 0
