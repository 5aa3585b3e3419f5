"""Our model's logits against transformers' on tiny random configs (fp32, max abs diff < 1e-4).

"Mathematically equivalent" is not bitwise identical: chunking and batching change the order of
floating-point sums, so every comparison uses a tolerance.
"""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from common.engine_config import EngineConfig
from engine.forward_context import ForwardContext, forward_context
from engine.llm_engine import LLMEngine
from common.messages import SamplingParams
from engine.request import Request
from engine.scheduler import ScheduledBatch

TOL = 1e-4


def make_engine(model_dir, **kw):
    cfg = EngineConfig(model=model_dir, dtype="float32", device="cpu", kv_cache_memory=8 << 20,
                       max_model_len=256, block_size=4, **kw)
    return LLMEngine(cfg)


def hf_logits(model_dir, ids: list[int]) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]  # [len, vocab]


def run_rows(engine: LLMEngine, entries: list[tuple[Request, int]]) -> list[torch.Tensor]:
    """Run one forward over `entries` and return, per entry, logits at all of its rows."""
    for req, n in entries:
        assert engine.block_manager.allocate(req, n) == n
    batch = ScheduledBatch(entries, sum(n for _, n in entries))
    input_ids, positions, meta, _, _ = engine.runner._prepare(batch)
    with torch.inference_mode(), forward_context(ForwardContext(meta, engine.runner.kv_caches)):
        logits = engine.model.compute_logits(engine.model(input_ids, positions))
    out, row = [], 0
    for req, n in entries:
        out.append(logits[row:row + n])
        row += n
        req.num_computed_tokens += n
    return out


def new_request(rid, ids):
    return Request(rid, ids, SamplingParams(), 64, 0.0, None)


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


def test_decode_batched_with_others(tiny_model_dir):
    """Sequence A is decoded token by token while batched with other sequences' decodes and a
    prefill chunk; its logits at every position must match the reference."""
    g = torch.Generator().manual_seed(3)
    a_ids = torch.randint(3, 256, (20,), generator=g).tolist()
    others = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (9, 14, 31)]
    ref = hf_logits(tiny_model_dir, a_ids)
    engine = make_engine(tiny_model_dir)
    a = new_request("a", a_ids[:12])
    a.all_token_ids = list(a_ids)  # the rest are fed one by one as if sampled
    reqs = [new_request(f"o{i}", ids) for i, ids in enumerate(others)]
    run_rows(engine, [(a, 12), (reqs[0], 9), (reqs[1], 14)])
    late = reqs[2]
    for step in range(12, 20):
        entries = [(a, 1), (reqs[0], 1), (reqs[1], 1)]
        for r in reqs[:2]:
            r.all_token_ids.append(int(torch.randint(3, 256, (1,), generator=g)))
        if step == 14:
            entries.append((late, 16))  # a prefill chunk joins the same flat batch
        elif step > 14 and late.num_computed_tokens < len(late.all_token_ids):
            entries.append((late, len(late.all_token_ids) - late.num_computed_tokens))
        rows = run_rows(engine, entries)
        assert (rows[0][0] - ref[step]).abs().max().item() < TOL, f"position {step}"
