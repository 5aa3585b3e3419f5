"""`"trace": true` through the real server (default model, float32): the response's trace has the
model's shapes at every stop from the chat template to detokenization, for the prefill and one
decode step; a stream carries it in its last chunk only; a server without --enable-trace refuses
the field with a 400 naming it."""
from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from server_process import start_server, stream_post

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
# SmolLM2-135M: hidden 576, 9 heads and 3 KV heads of 64, MLP 1536, vocabulary 49152
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 576, 9, 3, 64, 1536, 49152


@pytest.fixture(scope="module")
def trace_server():
    s = start_server("--enable-trace")
    yield s
    s.stop()


def rows_of(trace: dict) -> dict[str, dict]:
    return {row["stop"]: row for row in trace["stops"]}


def test_chat_trace_has_every_stop(trace_server):
    client = OpenAI(base_url=f"{trace_server.url}/v1", api_key="none", max_retries=0, timeout=120)
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0,
                                         extra_body={"trace": True, "ignore_eos": True})
    trace, n = out.model_extra["trace"], out.usage.prompt_tokens
    assert (trace["choice"], trace["layer"], trace["engine"]["dtype"]) == (0, 0, "float32")
    assert trace["engine"]["queue_ms"] >= 0
    prefill, decode = trace["steps"]["prefill"], trace["steps"]["decode"]
    assert (prefill["tokens"], prefill["cached_tokens"], decode["tokens"], decode["context_tokens"]) == (n, 0, 1, n + 1)
    rows = rows_of(trace)
    names = list(rows)
    assert names[:3] == ["chat_template", "tokenization", "embed_tokens"] and names[-1] == "detokenization"
    assert rows["chat_template"]["prefill"]["input"] == f"1 message, {len(MESSAGES[0]['content'])} characters"
    assert rows["tokenization"]["prefill"]["output"] == [1, n] and rows["tokenization"]["prefill"]["ms"] >= 0
    expected = {  # stop: (prefill in, prefill out), the decode step's with 1 token
        "embed_tokens": ([1, n], [1, n, HIDDEN]),
        "input_layernorm": ([1, n, HIDDEN], [1, n, HIDDEN]),
        "q_proj": ([1, n, HIDDEN], [1, n, HEADS * HEAD_DIM]),
        "k_proj": ([1, n, HIDDEN], [1, n, KV_HEADS * HEAD_DIM]),
        "rope": ([1, n, HEADS + KV_HEADS, HEAD_DIM], [1, n, HEADS + KV_HEADS, HEAD_DIM]),
        "attention": ([1, n, HEADS, HEAD_DIM], [1, n, HEADS, HEAD_DIM]),
        "o_proj": ([1, n, HEADS * HEAD_DIM], [1, n, HIDDEN]),
        "gate_proj": ([1, n, HIDDEN], [1, n, MLP]),
        "down_proj": ([1, n, MLP], [1, n, HIDDEN]),
        "norm": ([1, n, HIDDEN], [1, n, HIDDEN]),
    }
    for stop, (shape_in, shape_out) in expected.items():
        assert (rows[stop]["prefill"]["input"], rows[stop]["prefill"]["output"]) == (shape_in, shape_out), stop
        one = [[*s[:1], 1, *s[2:]] for s in (shape_in, shape_out)]
        assert [rows[stop]["decode"]["input"], rows[stop]["decode"]["output"]] == one, stop
    assert rows["kv_write"]["prefill"]["output"] == [1, KV_HEADS, n, HEAD_DIM]
    assert rows["kv_write"]["decode"]["output"] == [1, KV_HEADS, n + 1, HEAD_DIM]
    assert rows["attention"]["prefill"]["shapes"]["scores"] == [1, HEADS, n, n]
    assert rows["attention"]["decode"]["shapes"]["scores"] == [1, HEADS, 1, n + 1]
    assert rows["lm_head"]["prefill"]["output"] == [1, 1, VOCAB]  # the last position only
    assert rows["sampling"]["prefill"]["input"] == [1, VOCAB] and rows["sampling"]["decode"]["output"] == [1]
    assert rows["q_proj"]["prefill"]["step_ms"] is None and "merged" in rows["q_proj"]["note"]
    assert rows["qkv_proj"]["prefill"]["all_layers_step_ms"] >= rows["qkv_proj"]["prefill"]["step_ms"] >= 0
    detok = rows["detokenization"]
    assert detok["prefill"]["input"] == [1] and detok["decode"]["input"] == [1] and detok["tokens"] == 2


def test_a_stream_carries_the_trace_in_its_last_chunk(trace_server):
    url = f"{trace_server.url}/v1/chat/completions"
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "stream": True, "trace": True}
    chunks = stream_post(url, body)
    assert [i for i, c in enumerate(chunks) if "trace" in c] == [len(chunks) - 1]
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert rows_of(chunks[-1]["trace"])["embed_tokens"]["decode"]["output"] == [1, 1, HIDDEN]
    with_usage = stream_post(url, {**body, "stream_options": {"include_usage": True}})
    assert [i for i, c in enumerate(with_usage) if "trace" in c] == [len(with_usage) - 1]
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] == 3


def test_completions_trace_the_first_choice(trace_server):
    client = OpenAI(base_url=f"{trace_server.url}/v1", api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2, n=2,
                                    temperature=0.8, extra_body={"trace": True})
    rows = rows_of(out.model_extra["trace"])
    assert "chat_template" not in rows
    assert rows["tokenization"]["prefill"]["input"] == "text: 24 characters"
    assert rows["tokenization"]["prefill"]["output"][1] == out.usage.prompt_tokens
    plain = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert "trace" not in plain.model_extra


def test_trace_is_refused_without_the_flag(default_server):
    r = httpx.post(f"{default_server.url}/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 2, "trace": True})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "trace" and "--enable-trace" in error["message"]
