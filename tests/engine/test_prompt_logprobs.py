"""Prompt logprobs in the engine: from every prefill chunk, whatever the prefix cache holds, on the
real default model (float32, dense weights) against transformers; and the bookkeeping alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from common.errors import InvalidRequest
from common.messages import SamplingParams
from engine.core.outputs import PromptLogprobsChunk
from engine.core.request import Request
from engine.llm import LLM
from engine.runner.prompt_logprobs import select_rows

TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the forest where "
        "nobody can see it any more, not even the owl that watches from the old oak tree. " * 2)


@pytest.fixture(scope="module")
def llm():
    # prefill chunks of 32 tokens: a longer prompt's logprobs come from several steps
    return LLM(dtype="float32", device="cpu", quantization="none", kv_cache_memory=128 << 20, max_model_len=512,
               max_num_seqs=8, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def reference(llm):
    ids = llm.tokenizer.encode(TEXT)
    hf = AutoModelForCausalLM.from_pretrained(str(llm.engine.model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return ids, logprobs


@pytest.mark.slow
def test_chunked_prompt_logprobs_equal_transformers_beside_other_requests(llm, reference):
    ids, ref = reference
    assert len(ids) > 64
    asking = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    plain = SamplingParams(temperature=0, max_tokens=4)
    outs = llm.generate([ids[:20], ids, ids[5:50]], [plain, asking, plain])
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    entries = outs[1].prompt_logprobs
    assert entries is not None and len(entries) == len(ids) and entries[0] is None
    for i, entry in enumerate(entries[1:], start=1):
        assert entry[0].token_id == ids[i] and len(entry) == 4
        assert abs(entry[0].logprob - ref[i - 1, ids[i]].item()) < 1e-4
        best = ref[i - 1].topk(3)
        assert [e.token_id for e in entry[1:]] == best.indices.tolist()
        assert [e.logprob for e in entry[1:]] == pytest.approx(best.values.tolist(), abs=1e-4)


@pytest.mark.slow
def test_prompt_logprobs_whatever_the_prefix_cache_holds(llm, reference):
    ids, ref = reference
    llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))  # the prompt's blocks are cached now
    again = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    assert again.num_cached_tokens == 0  # it computed its whole prompt
    assert [e[0].logprob for e in again.prompt_logprobs[1:]] == pytest.approx(
        [ref[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=1e-4)
    others = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))[0]
    assert others.num_cached_tokens >= 32  # requests that do not ask still use the cache


def test_out_of_range_prompt_logprobs_is_refused(llm):
    with pytest.raises(InvalidRequest) as refused:
        llm.generate([[1, 2, 3]], SamplingParams(prompt_logprobs=21))
    assert refused.value.param == "prompt_logprobs"


def test_rows_are_selected_only_for_prompt_positions_of_asking_requests():
    """Three requests in a step: one not asking, one mid-prompt (positions 16..31 of a 40-token
    prompt), one whose chunk reaches its last prompt position (which predicts the first output)."""
    table = torch.arange(3 * 64, dtype=torch.int32).view(3, 64)
    qsl = np.array([0, 1, 17, 27])
    args = dict(request_ids=["a", "b", "c"], rows=np.array([2, 0, 1]), qsl=qsl, num_computed=np.array([30, 16, 2]),
                seq_lens=np.array([31, 32, 12]), num_prompt=np.array([10, 40, 12]), token_ids=table, max_model_len=64)
    assert select_rows(wanted=np.array([-1, -1, -1]), **args) is None
    picked = select_rows(wanted=np.array([-1, 2, 0]), **args)
    assert picked.request_ids == ["b", "c"] and picked.first_positions == [16, 2]
    assert picked.counts.tolist() == [16, 9]  # c: positions 2..10; position 11 samples the output
    assert picked.rows.tolist() == list(range(1, 17)) + list(range(17, 26))
    assert picked.targets.tolist() == [p + 1 for p in range(16, 32)] + [64 + p + 1 for p in range(2, 11)]


def test_recomputed_positions_are_not_gathered_twice():
    """After a preemption a request recomputes its prompt: the positions it holds are skipped."""
    req = Request("r", list(range(10)), SamplingParams(prompt_logprobs=0), max_tokens=4)
    req.add_prompt_logprobs(PromptLogprobsChunk(0, [[1], [2], [3]], [[-1.0], [-2.0], [-3.0]], [1, 1, 1]))
    req.add_prompt_logprobs(PromptLogprobsChunk(0, [[1], [2]], [[-9.0], [-9.0]], [5, 5]))  # recomputed
    req.add_prompt_logprobs(PromptLogprobsChunk(2, [[3], [4]], [[-9.0], [-4.0]], [5, 2]))
    assert [e[0].logprob for e in req.prompt_logprobs] == [-1.0, -2.0, -3.0, -4.0]
    assert req.prompt_logprob_ranks == [1, 1, 1, 2]
