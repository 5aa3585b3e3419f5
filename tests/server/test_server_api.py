"""The real server (real default model, float32, greedy) driven by the OpenAI SDK and raw SSE."""
from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from server_process import stream_post

pytestmark = pytest.mark.slow  # the real server process (and the model)

CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(default_server):  # the default settings: the server the other test files share
    return default_server


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat_stream(server, **body) -> list[dict]:
    return stream_post(f"{server.url}/v1/chat/completions", {"messages": CHAT_MESSAGES, "temperature": 0, **body})


def streamed_texts(chunks: list[dict]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (choice["delta"].get("content") or "")
    return texts


def test_models_lists_the_default_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]
    assert models.data[0].model_extra["max_model_len"] == 2048


def test_no_cors_headers_unless_origins_are_allowed(server):
    """CORS is off by default: a page on another origin cannot read the answers (its preflight fails)."""
    preflight = httpx.options(f"{server.url}/v1/models", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "GET"}, timeout=30)
    assert "access-control-allow-origin" not in preflight.headers
    answer = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://app.example"}, timeout=30)
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


def test_chat_non_streaming(client):
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                         max_tokens=12)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    choice = out.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < out.usage.completion_tokens <= 12 and out.usage.prompt_tokens > 10
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_stream_shape_and_text_equal_non_streaming(server, client):
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                         max_tokens=10)
    full = out.choices[0]
    chunks = chat_stream(server, max_tokens=10, stream=True, stream_options={"include_usage": True})
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    first = chunks[0]["choices"][0]
    assert first["delta"]["role"] == "assistant" and first["delta"]["content"] == ""
    *body, finish, usage = chunks
    assert finish["choices"][0]["finish_reason"] == full.finish_reason and finish["choices"][0]["delta"] == {}
    assert all(c["choices"][0]["finish_reason"] is None for c in body)
    assert usage["choices"] == []
    assert (usage["usage"]["prompt_tokens"], usage["usage"]["completion_tokens"]) == (
        out.usage.prompt_tokens, out.usage.completion_tokens)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert streamed_texts(chunks)[0] == full.message.content


def test_sdk_streaming_with_include_usage(client):
    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                            max_tokens=6, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_n2_streamed_and_not(server, client):
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=1.0,
                                         seed=7, n=2, max_tokens=8)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.choices[0].message.content != out.choices[1].message.content  # choice i runs with seed + i
    assert out.usage.completion_tokens <= 16  # both choices counted
    if all(c.finish_reason == "length" for c in out.choices):
        assert out.usage.completion_tokens == 16
    chunks = chat_stream(server, temperature=1.0, seed=7, n=2, max_tokens=8, stream=True)
    texts = streamed_texts(chunks)
    assert texts == {0: out.choices[0].message.content, 1: out.choices[1].message.content}
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"].get("role") == "assistant"
        assert mine[-1]["finish_reason"] == out.choices[index].finish_reason


def test_seed_reproducible(client):
    def sample(seed):
        return client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=1.0,
                                              seed=seed, max_tokens=16).choices[0].message.content
    assert sample(1234) == sample(1234)
    assert sample(1234) != sample(4321)


def test_stop_string_spanning_tokens(server, client):
    full = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                          max_tokens=16, logprobs=True)
    choice = full.choices[0]
    text = choice.message.content
    # Token boundaries from the logprobs bytes; take a stop string across the 3rd boundary.
    tokens = [bytes(t.bytes).decode() for t in choice.logprobs.content]
    boundary = len("".join(tokens[:3]))
    stop = text[boundary - 2: boundary + 2]
    assert len(stop) == 4 and "".join(tokens[:3]).endswith(stop[:2]), (tokens, stop)
    expected = text[: text.index(stop)]
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                         max_tokens=16, stop=[stop, "never appears"])
    assert out.choices[0].message.content == expected
    assert out.choices[0].finish_reason == "stop" and out.choices[0].model_extra["stop_reason"] == stop
    chunks = chat_stream(server, max_tokens=16, stop=stop, stream=True)
    assert streamed_texts(chunks)[0] == expected  # nothing past the stop string was ever streamed
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    kept = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                          max_tokens=16, stop=stop, extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content == expected + stop


def test_chat_logprobs(client):
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, temperature=0,
                                         max_tokens=8, logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == out.usage.completion_tokens
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob)  # greedy takes the most likely token
    text = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace")
    # The token that ended it (EOS) has a logprob too, but no text in the content.
    assert text == choice.message.content + ("<|im_end|>" if choice.finish_reason == "stop" else "")


def test_completions_text_ids_batch_and_logprobs(server, client):
    out = client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                    temperature=0, max_tokens=5, logprobs=2)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.top_logprobs[0]) >= 2 and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == out.choices[0].text
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    by_ids = client.completions.create(model="SmolLM2-135M-Instruct", prompt=ids, temperature=0, max_tokens=5)
    assert by_ids.choices[0].text == out.choices[0].text
    batch = client.completions.create(model="SmolLM2-135M-Instruct", prompt=["The capital of France is", "1, 2, 3,"],
                                      temperature=0, max_tokens=5, n=2)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert {c.text for c in batch.choices if c.index < 2} == {out.choices[0].text}
    chunks = stream_post(f"{server.url}/v1/completions", {"prompt": "The capital of France is", "temperature": 0,
                                                          "max_tokens": 5, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == out.choices[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_tokenize_detokenize_round_trip(server):
    out = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello, 世界!", "return_token_strs": True}).json()
    assert out["count"] == len(out["tokens"]) == len(out["token_strs"]) and out["max_model_len"] == 2048
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": out["tokens"]}).json()
    assert back["prompt"] == "Hello, 世界!"
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT_MESSAGES}).json()
    assert chat["count"] > out["count"]


def test_vllm_extensions_and_logit_bias(server, client):
    def create(**kw):
        return client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, user="tester",
                                              **kw)
    greedy = create(temperature=0, max_tokens=6).choices[0].message.content
    # top_k=1 and min_p=1 keep only the most likely token: sampling at temperature 1 is greedy.
    assert create(temperature=1.0, max_tokens=6, extra_body={"top_k": 1}).choices[0].message.content == greedy
    assert create(temperature=1.0, max_tokens=6, extra_body={"min_p": 1.0}).choices[0].message.content == greedy
    # Past EOS with ignore_eos; skip_special_tokens=False shows the EOS token in the text.
    out = create(temperature=0, max_tokens=12, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert out.usage.completion_tokens == 12 and "<|im_end|>" in out.choices[0].message.content
    paris = httpx.post(f"{server.url}/tokenize", json={"prompt": " Paris", "add_special_tokens": False}).json()
    (paris_id,) = paris["tokens"]
    stopped = create(temperature=0, max_tokens=12, extra_body={"stop_token_ids": [paris_id]}).choices[0]
    assert stopped.finish_reason == "stop" and stopped.model_extra["stop_reason"] == paris_id
    assert stopped.message.content == "The capital of France is"
    at_least = create(temperature=0, max_tokens=12, extra_body={"min_tokens": 12, "repetition_penalty": 1.2})
    assert at_least.usage.completion_tokens == 12
    forced = create(temperature=0, max_tokens=3, logit_bias={str(paris_id): 100})
    assert forced.choices[0].message.content == " Paris" * 3


def test_metrics_use_vllm_names(server, client):
    client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT_MESSAGES, max_tokens=2)
    text = httpx.get(f"{server.url}/metrics").text
    samples = {line.split("{")[0]: line for line in text.splitlines() if line.startswith("vllm:")}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_queue_time_seconds_count", "vllm:num_preemptions_total", "vllm:request_success_total"):
        assert name in samples, name
        assert 'model_name="SmolLM2-135M-Instruct"' in samples[name]
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count"):
        assert float(samples[name].split()[-1]) > 0, name
    assert 'vllm:request_success_total{finished_reason="length"' in text
