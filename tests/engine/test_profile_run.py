"""The profile run's dummy step (engine/runner/profile_run.py): a real forward of the largest
step on throwaway KV blocks, its logits those of transformers on the same ids. On CUDA (the GPU
check) its measured peak sizes the KV cache."""
from __future__ import annotations

import pytest
import torch
from device_under_test import TEST_DEVICE
from test_model_parity import hf_logits

from common.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.profile_run import peak_activation_bytes, run_largest_step


@pytest.mark.parametrize("backend", ["torch-paged", "triton-paged"])
def test_largest_step_is_a_real_forward(tiny_llama_dir, backend, request):
    if backend == "triton-paged":
        request.getfixturevalue("triton_kernels")
    engine = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device=TEST_DEVICE,
                                    kv_cache_memory=8 << 20, max_model_len=256, block_size=4,
                                    attention_backend=backend, enforce_eager=True))
    logits = run_largest_step(engine.model, engine.runner.backend, torch.float32, engine.device, 48, 5, 4)
    ref = hf_logits(tiny_llama_dir, [0] * 48)[torch.linspace(0, 47, 5).long()]
    assert (logits.cpu() - ref).abs().max().item() < 1e-4
    if engine.device.type == "cuda":
        peak = peak_activation_bytes(engine.model, engine.runner.backend, torch.float32, engine.device, 48, 5, 4)
        assert 0 < peak < 64 << 20
