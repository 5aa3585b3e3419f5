"""Whole greedy generations on the Triton backend (on CUDA with its captured decode graphs, on a
CPU interpreted) give the tokens of the CPU engine on the torch backend, for every tiny model:
several requests of different lengths, prefill chunks batched with decodes."""
from __future__ import annotations

import torch
from device_under_test import TEST_DEVICE

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.llm_engine import LLMEngine


def greedy_tokens(model_dir: str, device: str, backend: str) -> dict[str, list[int]]:
    engine = LLMEngine(EngineConfig(model=model_dir, dtype="float32", device=device, kv_cache_memory=8 << 20,
                                    max_model_len=256, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                                    attention_backend=backend))
    g = torch.Generator().manual_seed(7)
    for i in range(5):
        prompt = torch.randint(3, 256, (4 + 19 * i,), generator=g).tolist()  # up to 80 tokens: chunked by 64
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=6 + 2 * i, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for delta in engine.step():
            tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
    return tokens


def test_triton_backend_generates_the_torch_backends_tokens(tiny_model_dir, triton_kernels):
    ours = greedy_tokens(tiny_model_dir, TEST_DEVICE, "triton-paged")
    reference = greedy_tokens(tiny_model_dir, "cpu", "torch-paged")
    assert ours == reference
    assert [len(ours[f"r{i}"]) for i in range(5)] == [6 + 2 * i for i in range(5)]
