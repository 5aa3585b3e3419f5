"""The shared checks raise one typed error: the field to blame travels beside the reason."""
from __future__ import annotations

import pytest

from common.errors import InvalidRequest
from common.messages import SamplingParams
from common.validation import check_token_ids, resolve_max_tokens, validate_sampling_params


def test_invalid_request_is_a_value_error_with_param_and_message():
    with pytest.raises(ValueError, match=r"^top_p: must be in \(0, 1\], got 0.0$") as info:
        validate_sampling_params(SamplingParams(top_p=0.0), vocab_size=10)
    assert isinstance(info.value, InvalidRequest)
    assert (info.value.param, info.value.message) == ("top_p", "must be in (0, 1], got 0.0")


def test_one_vocabulary_check_for_every_field():
    with pytest.raises(InvalidRequest) as info:
        check_token_ids("tokens", [1, 2**80], vocab_size=10)
    assert info.value.param == "tokens" and str(2**80) in info.value.message
    for params, param in ((SamplingParams(stop_token_ids=[10]), "stop_token_ids"),
                          (SamplingParams(logit_bias={-1: 1.0}), "logit_bias")):
        with pytest.raises(InvalidRequest, match="outside the vocabulary") as info:
            validate_sampling_params(params, vocab_size=10)
        assert info.value.param == param


def test_resolve_max_tokens_names_the_field_the_prompt_came_from():
    assert resolve_max_tokens([1, 2, 3], 10, None, 8) == 5
    assert resolve_max_tokens([1, 2, 3], 10, 4, 8) == 4
    for prompt, max_tokens, reason in (([], 4, "at least one token"), ([1, 99], 4, "token id 99"),
                                       ([1] * 8, None, "leave no room"), ([1] * 6, 4, "= 10 exceeds max_model_len 8")):
        with pytest.raises(InvalidRequest, match=reason) as info:
            resolve_max_tokens(prompt, 10, max_tokens, 8, param="messages")
        assert info.value.param == "messages" and str(info.value).startswith("messages: ")
