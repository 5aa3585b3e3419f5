"""Request bodies to SamplingParams: generation_config.json defaults, then the request's own."""
from __future__ import annotations

import json

import pytest

from common.generation_config import load_generation_defaults
from server.errors import ApiError
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.sampling import chat_sampling_params, completion_sampling_params

VOCAB, MAX_LEN = 1000, 512


@pytest.fixture
def defaults(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1, "max_new_tokens": 100,
        "do_sample": True, "eos_token_id": [1, 2], "min_p": float("nan")}))
    return load_generation_defaults(str(tmp_path))


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_unset_fields_take_the_model_defaults(defaults):
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1, "max_tokens": 100}
    p = chat_sampling_params(chat(), defaults, VOCAB, MAX_LEN)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.max_tokens) == (0.6, 0.9, 20, 1.1, 100)
    assert p.min_p == 0.0  # a NaN in the file is ignored


def test_request_fields_win_over_defaults(defaults):
    p = chat_sampling_params(chat(temperature=0, top_p=1.0, max_completion_tokens=7, max_tokens=9, n=2,
                                  stop="END", logprobs=True, top_logprobs=2, logit_bias={"5": -3}),
                             defaults, VOCAB, MAX_LEN)
    assert (p.temperature, p.top_p, p.max_tokens, p.n, p.stop, p.logprobs, p.logit_bias) == (
        0, 1.0, 7, 2, ["END"], 2, {5: -3.0})


def test_without_a_generation_config_openai_defaults_apply(tmp_path):
    defaults = load_generation_defaults(str(tmp_path))
    assert defaults == {}
    p = chat_sampling_params(chat(), defaults, VOCAB, MAX_LEN)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.logprobs) == (1.0, 1.0, 0, None, None)
    c = completion_sampling_params(CompletionRequest.model_validate({"prompt": "x"}), defaults, VOCAB, MAX_LEN)
    assert c.max_tokens == 16  # OpenAI's default for completions


def test_content_parts_are_joined_and_checks_name_the_field():
    body = chat(messages=[{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}])
    assert body.messages[0].text() == "a\nb"
    with pytest.raises(ApiError) as err:
        chat_sampling_params(chat(temperature=float("nan")), {}, VOCAB, MAX_LEN)
    assert (err.value.status, err.value.param) == (400, "temperature")
