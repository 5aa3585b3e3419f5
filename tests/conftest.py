"""Shared fixtures: tiny random-weight model folders written by transformers itself."""
from __future__ import annotations

import os

# The CUDA backend's Triton kernels run on CPU tensors only through Triton's interpreter, which
# triton picks for every kernel (its own library's too) as it is imported: so before anything
# imports it. On a CUDA test device (LLM_TEST_DEVICE=cuda, the GPU check) the kernels compile.
if os.environ.get("LLM_TEST_DEVICE", "cpu") == "cpu":  # (device_under_test.py reads the same)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from device_under_test import TEST_DEVICE  # noqa: E402
from native_tiers import BUILDABLE_TIERS, tier_module  # noqa: E402


def _save_tiny(tmp_path_factory, name: str, config) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init uses a small std; scale up so attention patterns and logits are far from flat.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    return str(path)


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    values = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    values.update(overrides)
    return LlamaConfig(**values)


def tiny_qwen3_config():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return _save_tiny(tmp_path_factory, "tiny-llama", tiny_llama_config())


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    return _save_tiny(tmp_path_factory, "tiny-llama3",
                      tiny_llama_config(rope_parameters=scaling, tie_word_embeddings=True))


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    return _save_tiny(tmp_path_factory, "tiny-qwen3", tiny_qwen3_config())


@pytest.fixture(params=["tiny_llama_dir", "tiny_llama3_dir", "tiny_qwen3_dir"])
def tiny_model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def triton_kernels():
    """engine.attention.triton_kernels (the CUDA backend's), runnable on TEST_DEVICE: compiled on
    CUDA, interpreted on a CPU."""
    pytest.importorskip("triton")
    if TEST_DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "Triton's interpreter must be on before triton is imported"
    return importlib.import_module("engine.attention.triton_kernels")



@pytest.fixture(params=[pytest.param(name, id=name) for name in BUILDABLE_TIERS])
def native_tier(request):
    """Every native kernel tier this machine's compiler targets, each a test of its own
    (native_tiers.tier_module: skipped where the CPU lacks the tier's flags)."""
    return tier_module(request.param)
