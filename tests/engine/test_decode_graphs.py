"""Decode steps at padded batch sizes from static buffers (engine/runner/decode_graphs.py): the
bucketing, and on CPU the replay stand-in (an eager call with the padded inputs) against the
unpadded step, for the torch backend (native kernels on and off) and the Triton backend
(interpreted). On CUDA (the GPU check) the same tests replay captured graphs."""
from __future__ import annotations

import pytest
import torch
from device_under_test import TEST_DEVICE
from test_model_parity import new_request

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from engine.llm_engine import LLMEngine
from engine.runner.decode_graphs import DecodeGraphs, capture_sizes, padded_size


def test_capture_sizes_and_padding():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(1) == [1]
    sizes = capture_sizes(20)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 20, 21)] == [1, 2, 4, 8, 8, 16, 20, 20, None]


def make_engine(model_dir: str, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model_dir, dtype="float32", device=TEST_DEVICE, kv_cache_memory=8 << 20,
                                  max_model_len=256, block_size=4, max_num_seqs=20, enforce_eager=True, **kw))


def graphs_of(engine: LLMEngine) -> DecodeGraphs:
    runner = engine.runner
    graphs = DecodeGraphs(engine.model, runner.backend, runner.kv_caches, capture_sizes(20), 256, 4,
                          engine.block_manager.num_blocks, engine.device)
    if engine.device.type == "cuda":
        with torch.inference_mode():
            graphs.capture()
    return graphs


BACKENDS = [dict(native_kernels=True), dict(native_kernels=False), dict(attention_backend="triton-paged")]


@pytest.mark.parametrize("backend", BACKENDS, ids=["native", "torch", "triton"])
def test_padded_decode_equals_unpadded(tiny_llama_dir, backend, monkeypatch, request):
    """5 sequences of different lengths decode 3 steps (padded to 8 rows): the hidden states of
    the padded call equal the plain step's at every real row."""
    if "attention_backend" in backend:
        request.getfixturevalue("triton_kernels")
    engine = make_engine(tiny_llama_dir, **backend)
    runner = engine.runner
    g = torch.Generator().manual_seed(0)
    reqs = [new_request(f"r{i}", torch.randint(3, 256, (n,), generator=g).tolist()) for i, n in
            enumerate((3, 17, 40, 9, 66))]
    for r in reqs:
        r.token_ids += torch.randint(3, 256, (3,), generator=g).tolist()  # decoded tokens, fed as if sampled
    so = SchedulerOutput([], [], {})
    for r in reqs:
        assert engine.block_manager.allocate(r, r.num_prompt_tokens) == r.num_prompt_tokens
        so.new_requests.append(NewRequestData(r.request_id, list(r.token_ids), r.num_prompt_tokens, r.params,
                                              list(r.block_ids), 0))
        so.num_scheduled_tokens[r.request_id] = r.num_prompt_tokens
    graphs = graphs_of(engine)
    with torch.inference_mode():
        runner.update_states(so)
        runner.forward(runner.prepare_inputs(so))
        for r in reqs:
            r.num_computed_tokens = r.num_prompt_tokens
        for _ in range(3):
            so = SchedulerOutput([], [], {})
            for r in reqs:
                before = len(r.block_ids)
                assert engine.block_manager.allocate(r, 1) == 1
                so.cached_requests.append(CachedRequestData(r.request_id, r.block_ids[before:], r.num_computed_tokens))
                so.num_scheduled_tokens[r.request_id] = 1
            runner.update_states(so)
            inputs = runner.prepare_inputs(so)
            runner.decode_graphs = None
            plain = runner.forward(inputs).clone()
            runner.decode_graphs = graphs
            assert graphs.takes(inputs.attention.num_tokens, inputs.attention.num_reqs, False)
            padded = runner.forward(inputs).clone()
            assert (padded - plain).abs().max().item() < 1e-5
            for r in reqs:
                r.num_computed_tokens += 1


def test_generation_with_padded_decode_steps(tiny_llama_dir):
    """Whole greedy generations of 7 requests (decode batches of 7 down to 1 rows, padded to 8,
    4, 2, 1) give the tokens of the engine without it."""
    outputs = []
    padded_steps = []
    for use_graphs in (False, True):
        engine = make_engine(tiny_llama_dir)
        if use_graphs:
            graphs = engine.runner.decode_graphs = graphs_of(engine)
            run = graphs.run
            graphs.run = lambda *args, run=run: padded_steps.append(len(args[0])) or run(*args)  # type: ignore
        g = torch.Generator().manual_seed(1)
        for i in range(7):
            prompt = torch.randint(3, 256, (5 + 7 * i,), generator=g).tolist()
            engine.add_request(f"q{i}", prompt, SamplingParams(temperature=0.0, max_tokens=4 + 3 * i,
                                                               ignore_eos=True))
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for delta in engine.step():
                tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
    assert len(padded_steps) >= 20 and 7 in padded_steps and 1 in padded_steps  # the decode steps took it
    assert [len(outputs[1][f"q{i}"]) for i in range(7)] == [4 + 3 * i for i in range(7)]
