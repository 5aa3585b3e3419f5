"""Reasoning through the real server (--reasoning-parser deepseek_r1) with the Qwen3 chat format:
the default model's weights and tokenizer with a Qwen3-format chat template whose generation
prompt opens a `<think>` block (tests/server/data/qwen3_thinking_template.jinja; Qwen3-Thinking's
form, `enable_thinking: false` writes the empty block instead). What the model writes is then
reasoning until `</think>`: `reasoning_content` on chat completions (message and stream deltas),
a reasoning item on /v1/responses, a thinking block on /v1/messages. To have the small model end
its reasoning, a logit bias favours the tokens of `</think>`; the structured output then holds
for the answer after it. Also here: the key from `x-api-key` and from Authorization."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from anthropic import Anthropic
from openai import OpenAI

from common.default_model import default_model_dir
from server_process import start_server, stream_post

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

KEY = "test-key"
TEMPLATE = Path(__file__).parent / "data" / "qwen3_thinking_template.jinja"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def server(default_server):  # default_server: the default model is converted once, before this copy
    folder = Path(tempfile.mkdtemp(prefix="qwen3-format-"))
    for f in default_model_dir().iterdir():
        if f.name != "chat_template.jinja":
            os.symlink(f, folder / f.name)
    shutil.copy(TEMPLATE, folder / "chat_template.jinja")
    s = start_server(str(folder), "--served-model-name", "m", "--reasoning-parser", "deepseek_r1",
                     "--api-key", KEY, "--default-chat-template-kwargs", '{"enable_thinking": true}')
    yield s
    s.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def openai(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def close_think_bias(server) -> dict[str, float]:
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "</think>", "add_special_tokens": False},
                     headers={"Authorization": f"Bearer {KEY}"}).json()["tokens"]
    return {str(i): 4.0 for i in ids}  # enough to end the block after a sentence


def chat(openai, **kw):
    args = dict(model="m", messages=ASK, temperature=0, max_tokens=12)
    args.update(kw)
    return openai.chat.completions.create(**args)


def test_reasoning_content_when_the_block_never_closes(openai, server):
    whole = chat(openai).choices[0]
    # the model ends (EOS or max_tokens) inside the open block: all of it is reasoning
    assert whole.message.reasoning_content and not whole.message.content
    chunks = stream_post(f"{server.url}/v1/chat/completions",
                         {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 12, "stream": True},
                         headers={"Authorization": f"Bearer {KEY}"})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == whole.message.reasoning_content
    assert "".join(d.get("content") or "" for d in deltas) == ""


def test_structured_answer_after_the_reasoning(openai, server, close_think_bias):
    body = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 200, "logit_bias": close_think_bias,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}}
    headers = {"Authorization": f"Bearer {KEY}"}
    whole = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=120).json()
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    assert set(json.loads(message["content"])) == {"city"}  # the grammar held after the block
    chunks = stream_post(f"{server.url}/v1/chat/completions", {**body, "stream": True}, headers=headers)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]


def test_tool_call_after_the_reasoning(openai, close_think_bias):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": ANSWER}}]
    out = chat(openai, tools=tools, tool_choice="required", max_tokens=200,
               logit_bias=close_think_bias).choices[0]
    assert out.message.reasoning_content and out.finish_reason == "tool_calls"
    assert out.message.tool_calls[0].function.name == "get_weather"
    assert set(json.loads(out.message.tool_calls[0].function.arguments)) == {"city"}


def test_enable_thinking_false_per_request(openai):
    thinking = chat(openai)
    plain = chat(openai, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert plain.choices[0].message.content and getattr(plain.choices[0].message, "reasoning_content", None) is None
    # the template wrote the empty block into the prompt instead of opening one
    assert plain.usage.prompt_tokens > thinking.usage.prompt_tokens


def test_reserved_template_kwarg_is_refused(server):
    response = httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                          json={"messages": ASK, "chat_template_kwargs": {"tokenize": True}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "chat_template_kwargs.tokenize"


def test_reasoning_item_on_responses(openai):
    args = dict(model="m", input="What is the capital of France?", max_output_tokens=12, temperature=0)
    whole = openai.responses.create(**args)
    assert [item.type for item in whole.output] == ["reasoning"]
    reasoning = whole.output[0].content[0].text
    assert reasoning
    with openai.responses.stream(**args) as stream:
        events = list(stream)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert events[-1].type == f"response.{whole.status}"
    plain = openai.responses.create(**args, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert [item.type for item in plain.output] == ["message"]


def test_thinking_block_on_messages_with_x_api_key(server):
    client = Anthropic(base_url=server.url, api_key=KEY, max_retries=0)  # sends x-api-key
    args = dict(model="m", max_tokens=12, messages=ASK, extra_body={"temperature": 0})
    whole = client.messages.create(**args)
    assert [b.type for b in whole.content] == ["thinking"] and whole.content[0].thinking
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == whole.content[0].thinking
    plain = client.messages.create(**args, thinking={"type": "disabled"})
    assert [b.type for b in plain.content] == ["text"]
    refused = httpx.post(f"{server.url}/v1/messages", json={"model": "m", "max_tokens": 4, "messages": ASK})
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
