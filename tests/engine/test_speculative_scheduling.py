"""Speculative decoding in the scheduler, with a fake runner and no model: the budget counts the
drafted tokens, outputs equal those without speculation, no block leaks after rejections, and
preemption and abort in the middle of drafting are clean."""
from __future__ import annotations

import random

import pytest

from common.messages import SamplingParams
from common.speculative_config import SpeculativeConfig
from engine.core.block_manager import BlockManager
from engine.core.engine_core import EngineCore
from engine.core.outputs import RunnerOutput, SchedulerOutput
from engine.core.scheduler import Scheduler
from scheduler_mirror import SchedulerMirror

VOCAB = 256
BLOCK_SIZE = 16
PERIOD = 7


def next_token(tokens: list[int]) -> int:
    """A deterministic 'model' that mostly repeats the token PERIOD back (so n-gram drafts are
    often right) and breaks the pattern at every 11th position (so some are rejected)."""
    if len(tokens) % 11 == 0:
        return 3 + (tokens[-1] * 17) % (VOCAB - 3)
    return tokens[-PERIOD] if len(tokens) >= PERIOD else 5


class VerifyingRunner:
    """Keeps its own copy of each request from the scheduler's structs; samples every position of
    a drafted request and accepts the draft while it matches, as the real runner does."""

    def __init__(self):
        self.mirror = SchedulerMirror()
        self.tokens, self.blocks, self.computed = self.mirror.tokens, self.mirror.blocks, self.mirror.computed
        self.steps: list[dict[str, int]] = []
        self.longest: dict[str, int] = {}  # the most tokens a request ever had here (kept after it ends)
        self.drafted = self.accepted = 0

    def execute(self, so: SchedulerOutput) -> RunnerOutput:
        self.mirror.apply(so)
        self.steps.append(dict(so.num_scheduled_tokens))
        done, sampled = [], []
        for rid, n in so.num_scheduled_tokens.items():
            tokens, computed, draft = self.tokens[rid], self.computed[rid], so.spec_token_ids.get(rid, [])
            assert computed + n <= len(tokens) + len(draft)
            assert len(self.blocks[rid]) * BLOCK_SIZE >= computed + n, "slots for every scheduled token"
            if draft:
                assert computed + n == len(tokens) + len(draft), "a draft is scheduled whole"
            if computed + n < len(tokens) + len(draft):
                continue  # a partial prefill chunk
            out = []
            for j in range(len(draft) + 1):
                token = next_token(tokens + draft[:j])
                out.append(token)
                if j == len(draft) or token != draft[j]:
                    break
            self.drafted += len(draft)
            self.accepted += len(out) - 1
            tokens.extend(out)
            self.longest[rid] = max(self.longest.get(rid, 0), len(tokens))
            done.append(rid)
            sampled.append(out)
        return RunnerOutput(done, sampled)


def build(spec: bool, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256):
    config = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4,
                               disable_by_batch_size=8) if spec else None
    bm = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    scheduler = Scheduler(bm, max_num_seqs, max_num_batched_tokens, max_model_len, {2}, config)
    return EngineCore(scheduler, VerifyingRunner(), VOCAB, max_model_len)


def prompts(n: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, VOCAB) for _ in range(rnd.randrange(10, 40))] for _ in range(n)]


def run(eng, ps, params, abort_at: dict[int, str] | None = None) -> dict[str, list[int]]:
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, params)
    out: dict[str, list[int]] = {}
    step = 0
    while eng.has_unfinished():
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
        step += 1
        if abort_at and step in abort_at:
            eng.abort(abort_at[step])
    return out


@pytest.mark.parametrize("max_tokens", [1, 5, 40])
def test_outputs_equal_without_speculation_and_budget_counts_drafts(max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ps = prompts(6, seed=1)
    plain = run(build(spec=False), ps, params)
    eng = build(spec=True)
    spec = run(eng, ps, params)
    assert spec == plain
    assert all(len(v) == max_tokens for v in spec.values())
    for step in eng.runner.steps:
        assert sum(step.values()) <= 64 and len(step) <= 8
    if max_tokens > 5:
        assert eng.runner.drafted > 0 and 0 < eng.runner.accepted < eng.runner.drafted, "some drafts fail"
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and sum(bm.ref_counts) == 0


def test_preemption_and_abort_while_drafting():
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    ps = prompts(6, seed=2)
    plain = run(build(spec=False), ps, params)
    tight = build(spec=True, num_blocks=22, max_model_len=128)
    got = run(tight, ps, params, abort_at={6: "r1", 9: "r4"})
    assert tight.scheduler.num_preemptions > 0 and tight.runner.drafted > 0
    for rid, tokens in got.items():
        if rid in ("r1", "r4"):
            assert tokens == plain[rid][: len(tokens)]  # cut short, never different
        else:
            assert tokens == plain[rid]
    bm = tight.block_manager
    assert bm.num_free_blocks == bm.num_blocks and sum(bm.ref_counts) == 0


def test_no_draft_for_penalised_requests_nor_past_max_tokens():
    """Penalties depend on the tokens before each position, so a penalised request never drafts;
    a draft never runs past max_tokens (the step's extra sampled token included)."""
    eng = build(spec=True)
    ps = prompts(2, seed=3)
    eng.add_request("pen", ps[0], SamplingParams(max_tokens=30, ignore_eos=True, presence_penalty=0.5))
    eng.add_request("free", ps[1], SamplingParams(max_tokens=30, ignore_eos=True))
    out = run(eng, [], SamplingParams())
    assert len(out["pen"]) == 30 and len(out["free"]) == 30
    assert eng.runner.steps[0]["pen"] == len(ps[0])  # its whole prompt in the first step
    assert all(step.get("pen", 1) == 1 for step in eng.runner.steps[1:])
    assert any(n > 1 for step in eng.runner.steps[1:] for rid, n in step.items() if rid == "free")
    # the runner's own copy: a draft that ran past max_tokens would leave extra tokens here
    assert eng.runner.longest["free"] == len(ps[1]) + 30


def test_drafting_pauses_for_a_request_whose_drafts_keep_failing():
    from engine.core.request import Request
    from engine.core.speculation import SUSPEND_STEPS, Speculator

    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=3),
                            max_model_len=256)
    req = Request("r", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=50), 50)
    speculator.start_step(1)
    assert speculator.draft(req) == [3, 1, 2]
    rounds = 0
    while speculator.draft(req):
        speculator.record(req, 3, 0)  # nothing accepted
        speculator.start_step(1)
        rounds += 1
    assert 2 <= rounds <= 5  # a few failures, not one unlucky draft, stop it
    for _ in range(SUSPEND_STEPS - 1):
        assert speculator.draft(req) == []
        speculator.start_step(1)
    assert speculator.draft(req) == [3, 1, 2]  # and it tries again after the pause
    stats = speculator.take_stats()
    assert stats.num_drafts == rounds and stats.num_accepted_tokens == 0 and speculator.take_stats() is None
