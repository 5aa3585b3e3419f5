"""Our model's logits against transformers' on tiny random configs (fp32, max abs diff < 1e-4).

On CUDA (the GPU check: LLM_TEST_DEVICE=cuda) the same tests run the Triton backend and the
captured decode graphs against transformers on the CPU.

"Mathematically equivalent" is not bitwise identical: chunking and batching change the order of
floating-point sums, so every comparison uses a tolerance.
"""
from __future__ import annotations

import pytest
import torch
from device_under_test import TEST_DEVICE
from transformers import AutoModelForCausalLM

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from engine.core.request import Request
from engine.llm_engine import LLMEngine

TOL = 1e-4


def make_engine(model_dir, **kw):
    cfg = EngineConfig(model=model_dir, dtype="float32", device=TEST_DEVICE, kv_cache_memory=8 << 20,
                       max_model_len=256, block_size=4, **kw)
    return LLMEngine(cfg)


def hf_logits(model_dir, ids: list[int]) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]  # [len, vocab]


def run_rows(engine: LLMEngine, entries: list[tuple[Request, int]]) -> list[torch.Tensor]:
    """Run one forward over `entries` through the runner's public steps (update_states,
    prepare_inputs, forward) and return, per entry, logits at all of its rows. A request's
    whole token list goes to the runner when it is first scheduled, so tokens past its prompt
    are fed as if they had been sampled."""
    so = SchedulerOutput([], [], {})
    for req, n in entries:
        num_blocks_before = len(req.block_ids)
        assert engine.block_manager.allocate(req, n) == n
        if req.request_id not in engine.runner.batch.row_of:
            so.new_requests.append(NewRequestData(req.request_id, list(req.token_ids), req.num_prompt_tokens,
                                                  req.params, list(req.block_ids), req.num_computed_tokens))
        else:
            so.cached_requests.append(CachedRequestData(req.request_id, req.block_ids[num_blocks_before:],
                                                        req.num_computed_tokens))
        so.num_scheduled_tokens[req.request_id] = n
    runner = engine.runner
    with torch.inference_mode():
        runner.update_states(so)
        inputs = runner.prepare_inputs(so)
        logits = engine.model.compute_logits(runner.forward(inputs))
    qsl = inputs.attention.query_start_loc_np
    rows = {rid: slice(int(qsl[i]), int(qsl[i + 1])) for i, rid in enumerate(inputs.request_ids)}
    out = []
    for req, n in entries:
        out.append(logits[rows[req.request_id]].cpu())
        req.num_computed_tokens += n
    return out


def new_request(rid, ids):
    return Request(rid, ids, SamplingParams(), 64)


def test_whole_prompt_prefill(tiny_model_dir):
    ids = list(torch.randint(3, 256, (23,), generator=torch.Generator().manual_seed(1)).tolist())
    ref = hf_logits(tiny_model_dir, ids)
    engine = make_engine(tiny_model_dir)
    (ours,) = run_rows(engine, [(new_request("a", ids), len(ids))])
    assert (ours - ref).abs().max().item() < TOL


def test_prefill_in_chunks_of_7(tiny_model_dir):
    ids = list(torch.randint(3, 256, (30,), generator=torch.Generator().manual_seed(2)).tolist())
    ref = hf_logits(tiny_model_dir, ids)
    engine = make_engine(tiny_model_dir)
    req = new_request("a", ids)
    got = []
    while req.num_computed_tokens < len(ids):
        n = min(7, len(ids) - req.num_computed_tokens)
        got.extend(run_rows(engine, [(req, n)]))
    assert (torch.cat(got) - ref).abs().max().item() < TOL


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native-decode", "torch-decode"])
def test_decode_batched_with_others(tiny_model_dir, native_kernels):
    """Sequence A is decoded token by token while batched with other sequences' decodes and a
    prefill chunk; its logits at every position must match the reference (the decodes through
    the native CPU kernel, where it builds, and through the torch path)."""
    g = torch.Generator().manual_seed(3)
    a_ids = torch.randint(3, 256, (20,), generator=g).tolist()
    others = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (9, 14, 31)]
    ref = hf_logits(tiny_model_dir, a_ids)
    engine = make_engine(tiny_model_dir, native_kernels=native_kernels)
    a = new_request("a", a_ids[:12])
    a.token_ids = list(a_ids)  # the rest are fed one by one as if sampled
    reqs = [new_request(f"o{i}", ids) for i, ids in enumerate(others)]
    for r in reqs[:2]:  # their decode tokens, known up front (fed as if sampled)
        r.token_ids += torch.randint(3, 256, (8,), generator=g).tolist()
    run_rows(engine, [(a, 12), (reqs[0], 9), (reqs[1], 14)])
    late = reqs[2]
    for step in range(12, 20):
        entries = [(a, 1), (reqs[0], 1), (reqs[1], 1)]
        if step == 14:
            entries.append((late, 16))  # a prefill chunk joins the same flat batch
        elif step > 14 and late.num_computed_tokens < len(late.token_ids):
            entries.append((late, len(late.token_ids) - late.num_computed_tokens))
        rows = run_rows(engine, entries)
        assert (rows[0][0] - ref[step]).abs().max().item() < TOL, f"position {step}"
