"""What vllm-router sends a replica: vLLM's render endpoints, and the fields it adds to every request.

The bodies below are the router's own (vllm-router 0.1.17 adds these fields, at these values, to
every chat and completions request it forwards, and posts the same body to the render endpoint
first); each is checked against the real server.
"""
from __future__ import annotations

import httpx
import pytest

from server_process import stream_post

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

ROUTER_CHAT_FIELDS = {"logprobs": False, "no_stop_trim": False, "ignore_eos": False,
                      "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                      "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True}
ROUTER_COMPLETION_FIELDS = {"echo": False, "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
                            "return_hidden_states": False}
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def url(default_server):
    return default_server.url


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def test_chat_render_is_the_prompt_the_engine_gets(url):
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "stream": False, **ROUTER_CHAT_FIELDS}
    r = _post(url, "/v1/chat/completions/render", body)
    assert r.status_code == 200, r.text
    rendered = r.json()
    tokens = _post(url, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert rendered["token_ids"] == tokens
    assert rendered["sampling_params"]["max_tokens"] == 8 and rendered["sampling_params"]["temperature"] == 0
    assert rendered["model"] == "SmolLM2-135M-Instruct" and rendered["stream"] is False
    # the engine sees the same prompt: the usage of the real request counts these tokens
    done = _post(url, "/v1/chat/completions", body).json()
    assert done["usage"]["prompt_tokens"] == len(tokens)


def test_completions_render_answers_one_per_prompt(url):
    ids = _post(url, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    r = _post(url, "/v1/completions/render", {"prompt": [PROMPT, "Hello"], **ROUTER_COMPLETION_FIELDS})
    assert r.status_code == 200, r.text
    rendered = r.json()
    assert [g["token_ids"] for g in rendered] == [ids, _post(url, "/tokenize", {"prompt": "Hello"}).json()["tokens"]]
    assert rendered[0]["sampling_params"]["max_tokens"] == 16  # OpenAI's completions default
    ids_prompt = _post(url, "/v1/completions/render", {"prompt": ids}).json()
    assert ids_prompt[0]["token_ids"] == ids


def test_render_refuses_what_generation_refuses(url):
    r = _post(url, "/v1/completions/render", {"prompt": PROMPT, "max_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = _post(url, "/v1/chat/completions/render", {"messages": MESSAGES, "bogus": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "bogus"


@pytest.mark.parametrize("stream", [False, True])
def test_router_fields_at_their_defaults_are_served(url, stream):
    chat = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": stream, **ROUTER_CHAT_FIELDS}
    completion = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": stream, **ROUTER_COMPLETION_FIELDS}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        if stream:
            events = stream_post(f"{url}{path}", body)
            assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        else:
            r = _post(url, path, body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions/render", {"messages": MESSAGES}), ("/v1/completions/render", {"prompt": PROMPT})])
def test_return_hidden_states_true_is_refused_by_name(url, path, body):
    r = _post(url, path, {**body, "return_hidden_states": True})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "return_hidden_states"
    assert "not supported" in r.json()["error"]["message"]


def test_no_stop_trim_keeps_the_stop_string(url):
    base = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    text = _post(url, "/v1/completions", base).json()["choices"][0]["text"]
    stop = text.strip().split()[0]  # the first word the model writes
    trimmed = _post(url, "/v1/completions", {**base, "stop": [stop]}).json()["choices"][0]
    kept = _post(url, "/v1/completions", {**base, "stop": [stop], "no_stop_trim": True}).json()["choices"][0]
    assert trimmed["finish_reason"] == kept["finish_reason"] == "stop"
    assert not trimmed["text"].endswith(stop)
    assert kept["text"] == trimmed["text"] + stop
    # the same as vLLM's own name for it
    same = _post(url, "/v1/completions", {**base, "stop": [stop], "include_stop_str_in_output": True}).json()
    assert same["choices"][0]["text"] == kept["text"]


def test_continue_final_message_leaves_the_last_message_open(url):
    messages = [*MESSAGES, {"role": "assistant", "content": "The capital of France is"}]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    rendered = _post(url, "/v1/chat/completions/render", body).json()["token_ids"]
    text = _post(url, "/detokenize", {"tokens": rendered}).json()["prompt"]
    assert text.endswith("The capital of France is")  # no end of turn after it
    closed = _post(url, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()["tokens"]
    assert closed[:len(rendered)] == rendered and len(closed) > len(rendered)
    done = _post(url, "/v1/chat/completions", {**body, "max_tokens": 4, "temperature": 0})
    assert done.status_code == 200 and done.json()["usage"]["prompt_tokens"] == len(rendered)
    both = _post(url, "/v1/chat/completions", {"messages": messages, "continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


def test_reasoning_switches_take_either_value(url):
    body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "include_reasoning": False,
            "separate_reasoning": False, "stream_reasoning": False}
    r = _post(url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
