"""The device sampler against a plain-torch reference, and its statistical behaviour."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from common.messages import SamplingParams
from engine.sample.filters import compute_probs
from engine.sample.sampler import Sampler, apply_penalties
from engine.sample.state import SamplingMetadata, SamplingState
from native_tiers import BUILDABLE_TIERS, tier_module
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


@dataclass
class Row:
    """One request as the sampler sees it: parameters, prompt and outputs so far."""

    params: SamplingParams
    prompt: list[int]
    output: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def state_for(rows: list[Row]) -> tuple[SamplingState, SamplingMetadata]:
    """A SamplingState with `rows` in rows 0..n-1, and the step view of all of them."""
    state = SamplingState(max(len(rows), 1), VOCAB, torch.device("cpu"), EOS)
    for i, r in enumerate(rows):
        state.add_row(i, r.params, r.prompt, r.output, r.generator)
    index = np.arange(len(rows))
    return state, state.metadata(index)


@pytest.fixture(params=["torch", *BUILDABLE_TIERS])
def native(request):
    """The draws' passes over the vocabulary through torch ops, or each native kernel tier's."""
    return None if request.param == "torch" else tier_module(request.param)


def make_rows(params_list, seed=0) -> list[Row]:
    g = torch.Generator().manual_seed(seed)
    return [Row(p, torch.randint(0, VOCAB, (6,), generator=g).tolist(),
                torch.randint(0, VOCAB, (8,), generator=g).tolist()) for p in params_list]


def processed_probs(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """The exact distribution each (random) row samples from, through our code."""
    state, md = state_for(rows)
    x = apply_penalties(logits.clone(), md, state)
    return compute_probs(x, md.temperature, md.top_k, md.max_top_k, md.top_p, md.min_p)


def test_probs_match_reference():
    rows = make_rows(CASES)
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    ours = processed_probs(logits, rows)
    for i, r in enumerate(rows):
        ref = reference_probs(logits[i], r.params, r.prompt, r.output)
        assert torch.allclose(ours[i], ref, atol=1e-5), f"case {i}: {r.params}"


@pytest.mark.parametrize("case", range(len(CASES)))
def test_sampled_frequencies_match_reference(case, native):
    """The sampler itself (rejection draws for top-p / min-p included) against the reference
    distribution: 6000 draws of one row, the largest frequency error below 0.025."""
    n = 6000
    row = make_rows([CASES[case]], seed=case)[0]
    logits = (torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(10 + case)) * 2).repeat(n, 1)
    state, md = state_for([row] * n)
    tokens = Sampler(torch.Generator().manual_seed(3), native)(logits.clone(), md, state).token_ids
    freq = torch.bincount(tokens, minlength=VOCAB).double() / n
    expected = reference_probs(logits[0], row.params, row.prompt, row.output).double()
    assert (freq - expected).abs().max().item() < 0.025, CASES[case]
    assert freq[expected == 0].sum().item() == 0  # never a token the filters removed


def test_penalties_change_distribution_as_defined():
    """Frequency and presence penalties lower repeated tokens by count*f + p (OpenAI); the
    repetition penalty divides positive and multiplies negative logits of seen tokens."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, -2.0
    row = Row(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [3, 4], [5, 5, 5, 6])
    state, md = state_for([row])
    out = apply_penalties(logits.clone(), md, state)[0]
    assert out[5].item() == pytest.approx(-(3 * 0.25 + 0.5))
    assert out[6].item() == pytest.approx(-(0.25 + 0.5))
    assert out[3].item() == 2.0 and out[7].item() == 0.0  # prompt tokens are not OpenAI-penalised
    row.params = SamplingParams(repetition_penalty=2.0)
    state, md = state_for([row])
    out = apply_penalties(logits.clone(), md, state)[0]
    assert out[3].item() == 1.0 and out[4].item() == -4.0 and out[7].item() == 0.0


def test_min_tokens_bans_eos_and_stop_ids():
    logits = torch.zeros(1, VOCAB)
    logits[0, 2] = logits[0, 9] = 50.0
    sampler = Sampler(torch.Generator().manual_seed(0))
    state, md = state_for([Row(SamplingParams(min_tokens=2, stop_token_ids=[9]), [3])])
    rows = np.array([0])
    for _ in range(2):  # the ban holds for the first two outputs...
        out = sampler(logits.clone(), md, state)
        assert out.token_ids[0].item() not in (2, 9)
        state.record_sampled(rows, torch.from_numpy(rows), out.token_ids)
        md = state.metadata(rows)
    out = sampler(logits.clone(), md, state)  # ...and is lifted once two exist
    assert out.token_ids[0].item() in (2, 9)


def test_empirical_frequencies_follow_probs(native):
    p = SamplingParams(temperature=1.0, top_k=8)
    n = 4000
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2)).repeat(n, 1)
    state, md = state_for([Row(p, [1])] * n)
    tokens = Sampler(torch.Generator().manual_seed(3), native)(logits, md, state).token_ids
    freq = torch.bincount(tokens, minlength=VOCAB).float() / n
    expected = reference_probs(logits[0], p, [1], [])
    assert (freq - expected).abs().max().item() < 0.03
    assert freq[expected == 0].sum().item() == 0  # never outside the top-k


def test_greedy_rows_take_argmax_in_mixed_batch():
    rows = make_rows([SamplingParams(temperature=0), SamplingParams(temperature=1.0)])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    state, md = state_for(rows)
    out = Sampler(torch.Generator().manual_seed(0))(logits.clone(), md, state)
    assert out.token_ids[0].item() == logits[0].argmax().item()


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=7),
                                    SamplingParams(temperature=0.9, top_p=0.5, min_p=0.05, top_k=20, seed=7)])
def test_seeded_row_independent_of_batch(params, native):
    logits = torch.randn(32, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[:] = logits[0]

    def seeded():
        return Row(params, [1], generator=torch.Generator().manual_seed(7))

    for _ in range(20):  # several draws: the seeded stream, not one lucky token
        state, md = state_for([seeded()])
        alone = Sampler(torch.Generator().manual_seed(0), native)(logits[:1].clone(), md, state)
        others = [Row(SamplingParams(temperature=1.0), [1]) for _ in range(31)]
        state, md = state_for(others[:13] + [seeded()] + others[13:])
        batched = Sampler(torch.Generator().manual_seed(99), native)(logits.clone(), md, state)
        assert alone.token_ids[0].item() == batched.token_ids[13].item()
        logits = logits + torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(_))


def test_logprobs_are_raw_model_logprobs():
    rows = make_rows([SamplingParams(temperature=0, logprobs=3, presence_penalty=2.0), SamplingParams(temperature=0)])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(6))
    state, md = state_for(rows)
    out = Sampler(torch.Generator())(logits.clone(), md, state)
    raw = logits[0].log_softmax(-1)
    assert out.logprob_token_ids is not None and out.logprobs is not None
    ids, values = out.logprob_token_ids[0].tolist(), out.logprobs[0].tolist()
    assert ids[0] == out.token_ids[0].item()
    assert values[0] == pytest.approx(raw[out.token_ids[0]].item(), abs=1e-5)
    top = raw.topk(3)
    assert ids[1:] == top.indices.tolist()
    assert md.num_logprobs[1] == -1  # the second row asked for none


def test_ties_break_to_the_lowest_id_everywhere(native):
    """Equal logits: argmax, top_k=1, a tiny top_p and the logprob ranking all choose the lower id."""
    logits = torch.zeros(1, VOCAB)
    logits[0, [31, 17, 40]] = 4.0  # a three-way tie for first place
    expected = 17
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1),
                   SamplingParams(temperature=1.0, top_p=1e-9), SamplingParams(temperature=0.7, top_k=1, top_p=0.5),
                   SamplingParams(temperature=0, logprobs=3)):
        for seed in range(5):
            state, md = state_for([Row(params, [1], generator=torch.Generator().manual_seed(seed))])
            out = Sampler(torch.Generator().manual_seed(seed), native)(logits.clone(), md, state)
            assert out.token_ids[0].item() == expected, params
    assert out.logprob_token_ids is not None
    assert out.logprob_token_ids[0].tolist() == [17, 17, 31, 40]


def test_top_k_beyond_the_vocabulary_is_off_in_a_mixed_batch():
    """top_k larger than the vocabulary means no top-k (as in vLLM), also next to rows that use
    it and rows that have it off."""
    rows = [Row(SamplingParams(temperature=1.0, top_k=5), [1]), Row(SamplingParams(temperature=1.0, top_k=1000), [1]),
            Row(SamplingParams(temperature=1.0), [1])]
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(8))
    probs = processed_probs(logits, rows)
    for i, r in enumerate(rows):
        expected = reference_probs(logits[i], SamplingParams(temperature=1.0, top_k=r.params.top_k
                                                             if r.params.top_k < VOCAB else 0), [1], [])
        assert torch.allclose(probs[i], expected, atol=1e-5)
    state, md = state_for(rows)
    assert md.max_top_k == 5
    Sampler(torch.Generator().manual_seed(0))(logits.clone(), md, state)
