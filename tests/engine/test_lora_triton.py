"""The LoRA delta's Triton kernels (engine/lora/triton_ops.py) against the torch path's arithmetic:
under Triton's interpreter on a CPU, compiled on a CUDA test device."""
from __future__ import annotations

import importlib
import os

import pytest
import torch
from device_under_test import TEST_DEVICE


@pytest.fixture(scope="module")
def ops():
    pytest.importorskip("triton")
    if TEST_DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "Triton's interpreter must be on before triton is imported"
    return importlib.import_module("engine.lora.triton_ops")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("k,n,r", [(64, 96, 16), (100, 70, 24)])  # a merged layer's shapes, and ragged tiles
def test_delta_equals_torch(ops, dtype, tol, k, n, r):
    gen = torch.Generator().manual_seed(k + n + r)
    slots = torch.tensor([-1, 0, 2, 1, -1, 2, 2, 0, 1], dtype=torch.int32)
    x = torch.randn(len(slots), k, generator=gen).to(dtype)
    a = (torch.randn(3, r, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(3, n, r, generator=gen).to(dtype)
    base = torch.randn(len(slots), n, generator=gen).to(dtype)
    expected = base.float().clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[i] += (x[i].float() @ a[s].float().t()) @ b[s].float().t()
    out = base.to(TEST_DEVICE)
    ops.add_lora_delta(x.to(TEST_DEVICE), out, a.to(TEST_DEVICE), b.to(TEST_DEVICE), slots.to(TEST_DEVICE))
    out = out.cpu().float()
    assert torch.equal(out[slots < 0], base[slots < 0].float())  # base rows untouched
    assert (out - expected).abs().max().item() < tol * expected.abs().max().item()


def test_engine_with_the_kernels_equals_peft(ops, tiny_qwen3_dir, tmp_path):
    """The whole model with every layer's delta through the kernels (as on CUDA): a step mixing the
    base model and an adapter, against transformers + peft."""
    from lora_adapters import make_adapter, peft_model
    from test_model_parity import run_rows
    from transformers import AutoModelForCausalLM

    from common.messages import LoraRequest, SamplingParams
    from engine.core.request import Request
    from engine.llm import LLM

    folder = make_adapter(tiny_qwen3_dir, tmp_path / "a", seed=7, r=8, alpha=16)
    llm = LLM(tiny_qwen3_dir, dtype="float32", device=TEST_DEVICE, kv_cache_memory=8 << 20, max_model_len=128,
              block_size=4, enable_lora=True, max_loras=2)
    assert llm.engine.lora_manager is not None
    for slots in llm.engine.lora_manager.slots.values():
        slots.triton = True
    ids = torch.randint(3, 256, (13,), generator=torch.Generator().manual_seed(4)).tolist()
    lora = Request("l", ids, SamplingParams(lora=LoraRequest("a", 1, str(folder))), 8)
    ours, base = run_rows(llm.engine, [(lora, 13), (Request("b", ids, SamplingParams(), 8), 13)])
    with torch.no_grad():
        expected = peft_model(tiny_qwen3_dir, folder)(torch.tensor([ids])).logits[0]
        hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
        expected_base = hf(torch.tensor([ids])).logits[0]
    assert (ours - expected).abs().max().item() < 1e-4
    assert (base - expected_base).abs().max().item() < 1e-4
