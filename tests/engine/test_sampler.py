"""The device sampler against a plain-torch reference, and its statistical behaviour."""
from __future__ import annotations

import pytest
import torch

from common.messages import SamplingParams
from engine.request import Request
from engine.sampler import Sampler, apply_penalties, compute_probs
from engine.sampling_batch import SamplingBatch
from sampler_reference import reference_probs

VOCAB = 50
EOS = {2}

CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.1),
    SamplingParams(temperature=1.0, top_k=10, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, repetition_penalty=1.3),
    SamplingParams(temperature=1.0, presence_penalty=1.5, frequency_penalty=0.5),
    SamplingParams(temperature=0.8, frequency_penalty=-1.0, logit_bias={7: 5.0, 8: -100.0}),
]


def make_requests(params_list, seed=0):
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for i, p in enumerate(params_list):
        prompt = torch.randint(0, VOCAB, (6,), generator=g).tolist()
        r = Request(f"r{i}", prompt, p, 100, 0.0, None)
        for t in torch.randint(0, VOCAB, (8,), generator=g).tolist():
            r.append_token(t)
        reqs.append(r)
    return reqs


def test_probs_match_reference():
    reqs = make_requests(CASES)
    logits = torch.randn(len(reqs), VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    batch = SamplingBatch.build(reqs, VOCAB, EOS, "cpu")
    ours = compute_probs(apply_penalties(logits, batch), batch)
    for i, r in enumerate(reqs):
        ref = reference_probs(logits[i], r.params, r.prompt_token_ids, r.output_token_ids)
        assert torch.allclose(ours[i], ref, atol=1e-5), f"case {i}: {r.params}"


def test_penalties_change_distribution_as_defined():
    """Frequency and presence penalties lower repeated tokens by count*f + p (OpenAI); the
    repetition penalty divides positive and multiplies negative logits of seen tokens."""
    r = Request("r", [3, 4], SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), 10, 0.0, None)
    for t in [5, 5, 5, 6]:
        r.append_token(t)
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, -2.0
    out = apply_penalties(logits, SamplingBatch.build([r], VOCAB, EOS, "cpu"))[0]
    assert out[5].item() == pytest.approx(-(3 * 0.25 + 0.5))
    assert out[6].item() == pytest.approx(-(0.25 + 0.5))
    assert out[3].item() == 2.0 and out[7].item() == 0.0  # prompt tokens are not OpenAI-penalised
    r.params = SamplingParams(repetition_penalty=2.0)
    out = apply_penalties(logits, SamplingBatch.build([r], VOCAB, EOS, "cpu"))[0]
    assert out[3].item() == 1.0 and out[4].item() == -4.0 and out[7].item() == 0.0


def test_min_tokens_bans_eos_and_stop_ids():
    r = Request("r", [3], SamplingParams(min_tokens=2, stop_token_ids=[9]), 10, 0.0, None)
    logits = torch.zeros(1, VOCAB)
    logits[0, 2] = logits[0, 9] = 50.0
    sampler = Sampler(torch.Generator().manual_seed(0))
    out = sampler(logits, SamplingBatch.build([r], VOCAB, EOS, "cpu"))
    assert out.token_ids[0] not in (2, 9)
    r.append_token(0), r.append_token(0)
    out = sampler(logits, SamplingBatch.build([r], VOCAB, EOS, "cpu"))
    assert out.token_ids[0] in (2, 9)


def test_empirical_frequencies_follow_probs():
    p = SamplingParams(temperature=1.0, top_k=8)
    n = 4000
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2)).repeat(n, 1)
    reqs = [Request(f"r{i}", [1], p, 10, 0.0, None) for i in range(n)]
    batch = SamplingBatch.build(reqs, VOCAB, EOS, "cpu")
    tokens = Sampler(torch.Generator().manual_seed(3))(logits, batch).token_ids
    freq = torch.bincount(torch.tensor(tokens), minlength=VOCAB).float() / n
    expected = reference_probs(logits[0], p, [1], [])
    assert (freq - expected).abs().max().item() < 0.03
    assert freq[expected == 0].sum().item() == 0  # never outside the top-k


def test_greedy_rows_take_argmax_in_mixed_batch():
    reqs = make_requests([SamplingParams(temperature=0), SamplingParams(temperature=1.0)])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    out = Sampler(torch.Generator().manual_seed(0))(logits, SamplingBatch.build(reqs, VOCAB, EOS, "cpu"))
    assert out.token_ids[0] == logits[0].argmax().item()


def test_seeded_row_independent_of_batch():
    logits = torch.randn(32, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[:] = logits[0]

    def seeded(seed):
        r = Request("s", [1], SamplingParams(temperature=1.0, seed=seed), 10, 0.0, torch.Generator().manual_seed(seed))
        return r

    alone = Sampler(torch.Generator().manual_seed(0))(logits[:1], SamplingBatch.build([seeded(7)], VOCAB, EOS, "cpu"))
    others = [Request(f"o{i}", [1], SamplingParams(temperature=1.0), 10, 0.0, None) for i in range(31)]
    batched = Sampler(torch.Generator().manual_seed(99))(
        logits, SamplingBatch.build(others[:13] + [seeded(7)] + others[13:], VOCAB, EOS, "cpu"))
    assert alone.token_ids[0] == batched.token_ids[13]


def test_logprobs_are_raw_model_logprobs():
    reqs = make_requests([SamplingParams(temperature=0, logprobs=3, presence_penalty=2.0), SamplingParams(temperature=0)])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(6))
    out = Sampler(torch.Generator())(logits, SamplingBatch.build(reqs, VOCAB, EOS, "cpu"))
    raw = logits[0].log_softmax(-1)
    entry = out.logprobs[0]
    assert entry[0].token_id == out.token_ids[0]
    assert entry[0].logprob == pytest.approx(raw[out.token_ids[0]].item(), abs=1e-5)
    top = raw.topk(3)
    assert [e.token_id for e in entry[1:]] == top.indices.tolist()
    assert out.logprobs[1] is None
