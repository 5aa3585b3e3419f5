"""The persistent batch against a from-scratch computation: over 200 steps with requests joining,
finishing, preempted and aborted, every row's tokens, running output counts, seen-token mask,
additive row (penalties, logit_bias, the min_tokens ban) and parameters equal what the
scheduler's own record of the request implies, and a reused row carries nothing of its previous
request."""
from __future__ import annotations

import random

import torch

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.core.stop import stop_token_ids
from engine.llm_engine import LLMEngine
from engine.runner.kv_cache import bytes_per_block


def random_params(rnd: random.Random) -> SamplingParams:
    kind = rnd.randrange(5)
    fields: dict = dict(max_tokens=rnd.randrange(4, 30), ignore_eos=rnd.random() < 0.5)
    if kind >= 1:
        fields.update(temperature=rnd.choice([0.0, 0.7, 1.0]), seed=rnd.choice([None, rnd.randrange(1000)]))
    if kind >= 2:
        fields.update(presence_penalty=rnd.choice([0.0, 0.5]), frequency_penalty=rnd.choice([0.0, -0.3, 0.4]),
                      repetition_penalty=rnd.choice([1.0, 1.2]))
    if kind >= 3:
        fields.update(logit_bias={rnd.randrange(3, 256): rnd.uniform(-5, 5) for _ in range(rnd.randrange(1, 4))})
    if kind >= 4:
        fields.update(min_tokens=rnd.randrange(1, 4), stop_token_ids=[rnd.randrange(3, 256)], top_k=5, top_p=0.9)
    return SamplingParams(**fields)


def expected_bias(p: SamplingParams, num_output: int, eos: set[int]) -> torch.Tensor:
    bias = torch.zeros(256)
    for t, b in (p.logit_bias or {}).items():
        bias[t] = b
    if num_output < p.min_tokens:
        for t in stop_token_ids(p, eos):
            bias[t] = float("-inf")
    return bias


def check_rows(engine: LLMEngine) -> int:
    batch = engine.runner.batch
    state = batch.sampling
    checked = 0
    for request_id, row in batch.row_of.items():
        req = engine.scheduler.requests.get(request_id)
        if req is None:
            continue  # finished in the last update; its row is freed at the next step
        p = req.params
        assert batch.num_tokens[row] == req.num_tokens
        assert batch.token_ids[row, : req.num_tokens].tolist() == req.token_ids
        assert state.temperature[row] == p.temperature and state.num_output_tokens[row] == req.num_output_tokens
        uses_penalties = p.repetition_penalty != 1 or p.presence_penalty != 0 or p.frequency_penalty != 0
        assert state.counts_outputs[row] == uses_penalties
        counts = torch.bincount(torch.tensor(req.output_token_ids, dtype=torch.int64), minlength=256).float()
        if uses_penalties:
            assert torch.equal(state.output_counts[row], counts), f"{request_id}: counts drifted"
        assert state.uses_repetition[row] == (p.repetition_penalty != 1)
        if p.repetition_penalty != 1:
            seen = torch.zeros(256, dtype=torch.bool)
            seen[req.token_ids] = True
            assert torch.equal(state.seen[row], seen), f"{request_id}: seen tokens"
        bias = expected_bias(p, req.num_output_tokens, engine.eos_token_ids)
        additive = bias - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
        uses_additive = bool(p.logit_bias) or p.presence_penalty != 0 or p.frequency_penalty != 0 or bool(
            bias.isinf().any())
        assert state.uses_additive[row] == uses_additive
        if uses_additive:
            assert torch.allclose(state.additive[row], additive, atol=1e-5), f"{request_id}: additive row"
        checked += 1
    return checked


def test_incremental_state_equals_from_scratch_over_200_steps(tiny_llama_dir):
    probe = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device="cpu", max_model_len=96,
                                   kv_cache_memory=1 << 20, block_size=4))
    per_block = bytes_per_block(probe.model.arch, 4, torch.float32)
    engine = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device="cpu", max_model_len=96,
                                    kv_cache_memory=32 * per_block, block_size=4, max_num_seqs=6,
                                    max_num_batched_tokens=32))
    rnd = random.Random(0)
    next_id, aborted, finished, checked = 0, 0, 0, 0
    for _ in range(200):
        if rnd.random() < 0.35 and len(engine.requests) < 10:
            prompt = [rnd.randrange(3, 256) for _ in range(rnd.randrange(5, 40))]
            engine.add_request(f"r{next_id}", prompt, random_params(rnd))
            next_id += 1
        if rnd.random() < 0.06 and engine.requests:
            assert engine.abort(rnd.choice(sorted(engine.requests)))
            aborted += 1
        finished += sum(d.finish_reason is not None for d in engine.step())
        checked += check_rows(engine)
    assert engine.scheduler.num_preemptions > 0 and aborted > 0 and finished > 10 and checked > 200
    while engine.has_unfinished():
        engine.step()
    engine.step()  # the last finished requests give their rows back
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.runner.batch.row_of and not engine.runner.generators
