"""Async scheduling (each step scheduled and launched before the previous one's ids are read)
against the plain loop, on a tiny random-weight model (on CPU here, on CUDA in the GPU check, where
the ids really arrive behind the step's kernels): the same tokens, finish reasons and
logprobs for every request, through chunked prefill, stop tokens, length limits, penalties, seeded
sampling, preemption, prefix-cache hits and aborts, and everything freed at the end.

Both engines run with batch-invariant rows: an async step can hold a row that turns out finished
(its ids were not read yet), and without invariance that extra row may move another row's logits
in their last bits, flipping a near tie. Unseeded sampling is left out for the same reason: its
draws come from one generator shared by the batch.
"""
from __future__ import annotations

import pytest
import torch
from device_under_test import TEST_DEVICE

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.llm_engine import LLMEngine
from engine.models.config import ModelArch, read_hf_config
from engine.runner.kv_cache import bytes_per_block


def make_engine(model_dir: str, async_scheduling: str, **overrides) -> LLMEngine:
    fields = dict(model=model_dir, dtype="float32", device=TEST_DEVICE, max_model_len=128, max_num_seqs=8,
                  max_num_batched_tokens=32, kv_cache_memory=1 << 20, batch_invariant=True,
                  async_scheduling=async_scheduling)
    fields.update(overrides)
    return LLMEngine(EngineConfig(**fields))


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]], arrivals: dict[int, list[str]],
        aborts: dict[int, list[str]] | None = None) -> dict[str, dict]:
    """Requests added at their arrival step, aborted at theirs; per request its tokens, finish
    reason and logprobs, from the deltas alone."""
    got = {rid: {"tokens": [], "finish": None, "logprobs": []} for rid in requests}
    step = 0
    while step in arrivals or engine.has_unfinished() or engine.in_flight is not None:
        for rid in arrivals.get(step, []):
            engine.add_request(rid, *requests[rid])
        for rid in (aborts or {}).get(step, []):
            engine.abort(rid)
        for delta in engine.step():
            entry = got[delta.request_id]
            assert entry["finish"] is None, f"{delta.request_id} got tokens after it finished"
            entry["tokens"] += delta.new_token_ids
            entry["finish"] = delta.finish_reason
            if delta.logprobs:
                entry["logprobs"] += [[(e.token_id, e.logprob) for e in position] for position in delta.logprobs]
        step += 1
        assert step < 2000, "the engine never finished"
    assert engine.block_manager.usage == 0.0 and not engine.scheduler.running and not engine.scheduler.waiting
    return got


def greedy(max_tokens: int | None, **fields) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **fields)


def workload(stop_token: int) -> tuple[dict[str, tuple[list[int], SamplingParams]], dict[int, list[str]]]:
    prompt = [(7 * i + 3) % 250 + 3 for i in range(40)]  # 40 tokens: chunks of a 32-token budget
    requests = {
        "greedy-short": ([5, 6, 7], greedy(1)),
        "greedy-long": (prompt, greedy(30)),
        "shares-prefix": (prompt[:32] + [9, 9, 9], greedy(12)),  # arrives later: a prefix-cache hit
        "stop-token": ([11, 12, 13, 14], SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_token],
                                                        min_tokens=2)),
        "seeded": ([20, 21, 22], SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=25, seed=7,
                                                ignore_eos=True)),
        "penalties": ([30, 31, 30, 31], SamplingParams(temperature=0.7, max_tokens=20, seed=3, ignore_eos=True,
                                                       presence_penalty=0.8, frequency_penalty=0.3,
                                                       repetition_penalty=1.3)),
        "logprobs": ([40, 41], greedy(6, logprobs=3)),
        "to-max-len": (prompt * 2 + prompt[:30], greedy(None)),  # 110 prompt tokens: the rest of max_model_len
    }
    arrivals = {0: ["greedy-short", "greedy-long", "stop-token", "seeded", "logprobs"],
                3: ["penalties", "to-max-len"], 9: ["shares-prefix"]}
    return requests, arrivals


def test_async_scheduling_gives_the_same_outputs(tiny_llama_dir):
    # the stop token: the 5th token "stop-token" would produce without one
    probe = run(make_engine(tiny_llama_dir, "off"), {"p": ([11, 12, 13, 14], greedy(8))}, {0: ["p"]})
    stop_token = probe["p"]["tokens"][4]
    requests, arrivals = workload(stop_token)

    plain_engine, async_engine = make_engine(tiny_llama_dir, "off"), make_engine(tiny_llama_dir, "on")
    assert not plain_engine.async_scheduling and async_engine.async_scheduling
    plain, ahead = run(plain_engine, requests, arrivals), run(async_engine, requests, arrivals)
    assert ahead == plain
    assert plain["stop-token"]["finish"] == "stop" and plain["stop-token"]["tokens"][-1] == stop_token
    assert plain["to-max-len"]["finish"] == "length" and len(plain["to-max-len"]["tokens"]) == 128 - 110
    assert plain["greedy-long"]["finish"] == "length" and len(plain["greedy-long"]["tokens"]) == 30
    assert len(plain["logprobs"]["logprobs"]) == 6
    assert async_engine.block_manager.prefix_hits > 0  # "shares-prefix" found the blocks of "greedy-long"


def test_async_scheduling_through_preemption(tiny_llama_dir):
    """A KV cache of 16 blocks for 7 requests that grow to 63 tokens (28 blocks): requests are
    preempted, some while a step holding them is in flight, and recompute; nothing changes."""
    per_block = bytes_per_block(ModelArch.from_hf_config(read_hf_config(tiny_llama_dir)), 16, torch.float32)
    requests = {f"r{i}": ([3 + i, 4 + i, 5 + i] * 6, greedy(40 + i)) for i in range(6)}
    requests["seeded"] = ([9, 8, 7] * 6, SamplingParams(temperature=1.0, max_tokens=45, seed=11, ignore_eos=True))
    outputs = []
    for mode in ("off", "on"):
        engine = make_engine(tiny_llama_dir, mode, max_model_len=64, kv_cache_memory=16 * per_block)
        assert engine.block_manager.num_blocks == 16
        outputs.append(run(engine, requests, {0: list(requests)}))
        assert engine.scheduler.num_preemptions > 0
    assert outputs[1] == outputs[0]
    assert all(o["finish"] == "length" for o in outputs[0].values())


@pytest.mark.parametrize("abort_step", [2, 5])
def test_async_scheduling_abort_in_flight(tiny_llama_dir, abort_step):
    """An abort while a step holding the request is in flight: the request gets nothing more, the
    others are unchanged, and everything is freed."""
    requests = {"stays": ([5, 6, 7, 8], greedy(20)), "aborted": ([9, 10, 11], greedy(20)),
                "late": ([12, 13], greedy(8))}
    arrivals = {0: ["stays", "aborted"], abort_step: ["late"]}
    aborts = {abort_step: ["aborted"]}
    plain = run(make_engine(tiny_llama_dir, "off"), requests, arrivals, aborts)
    ahead = run(make_engine(tiny_llama_dir, "on"), requests, arrivals, aborts)
    for rid in ("stays", "late"):
        assert ahead[rid] == plain[rid]
    assert ahead["aborted"]["finish"] is None and len(ahead["aborted"]["tokens"]) < 20


def test_async_scheduling_id_added_again_while_in_flight(tiny_llama_dir):
    """An id aborted and added again while a step holding the old request is in flight: the new
    request gets none of the old one's tokens."""
    engine = make_engine(tiny_llama_dir, "on")
    engine.add_request("a", [5, 6, 7, 8], greedy(20))
    for _ in range(3):
        engine.step()
    assert engine.in_flight is not None and "a" in engine.in_flight.requests
    engine.abort("a")
    engine.add_request("a", [9, 10, 11], greedy(6))
    tokens: list[int] = []
    while engine.has_unfinished():
        tokens += [t for d in engine.step() for t in d.new_token_ids]
    fresh = run(make_engine(tiny_llama_dir, "off"), {"a": ([9, 10, 11], greedy(6))}, {0: ["a"]})
    assert tokens == fresh["a"]["tokens"] and len(tokens) == 6
