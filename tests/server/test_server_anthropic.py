"""/v1/messages through the real server and the Anthropic SDK: create, stream (Anthropic's events,
equal to the non-streamed message at temperature 0), a tool round trip (tool_use, then a
tool_result), stop sequences, count_tokens, bad input in Anthropic's error body with a 4xx naming
the field, and a client that leaves mid-stream has its request aborted."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from anthropic import Anthropic, NotFoundError

from test_server_streams import aborted_count, wait_until_idle

pytestmark = pytest.mark.slow  # a real server process (and the model) per session

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the capital of France?"}]
# The SDK has no temperature argument any more (Claude's newer models take none); the API has it.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(default_server):
    return Anthropic(base_url=default_server.url, api_key="none", max_retries=0)


def test_create_answers_text(client):
    out = client.messages.create(model=MODEL, max_tokens=40, messages=ASK, system="Be brief.", extra_body=GREEDY,
                                 metadata={"user_id": "u1"})
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_")
    assert [b.type for b in out.content] == ["text"] and out.content[0].text.strip()
    assert out.stop_reason in ("end_turn", "max_tokens") and out.usage.output_tokens <= 40
    assert out.usage.input_tokens > 0


def test_max_tokens_and_stop_sequences(client):
    cut = client.messages.create(model=MODEL, max_tokens=3, messages=ASK, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    whole = client.messages.create(model=MODEL, max_tokens=40, messages=ASK, extra_body=GREEDY).content[0].text
    word = whole.split()[1]
    stopped = client.messages.create(model=MODEL, max_tokens=40, messages=ASK, extra_body=GREEDY, stop_sequences=[word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == whole[:whole.index(word)].rstrip() or whole.startswith(stopped.content[0].text)


def test_stream_equals_the_non_streamed_message(client):
    args = dict(model=MODEL, max_tokens=40, messages=ASK, extra_body=GREEDY)
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_start" in types and "content_block_stop" in types and "message_delta" in types
    assert final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)


def test_tool_round_trip(client):
    first = client.messages.create(model=MODEL, max_tokens=80, tools=TOOLS, tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "What's the weather in Paris?"}],
                                   extra_body=GREEDY)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER)
    second = client.messages.create(model=MODEL, max_tokens=30, tools=TOOLS, extra_body=GREEDY, messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C, sunny"}]}])
    # the prompt grew by the call and its result (part of it found in the prefix cache)
    prompt = [u.input_tokens + u.cache_read_input_tokens for u in (first.usage, second.usage)]
    assert second.content and prompt[1] > prompt[0]


def test_streamed_tool_use_equals_the_non_streamed_one(client):
    args = dict(model=MODEL, max_tokens=80, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                messages=[{"role": "user", "content": "What's the weather in Rome?"}], extra_body=GREEDY)
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_message()
    (use,) = [b for b in whole.content if b.type == "tool_use"]
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert (streamed.name, streamed.input) == (use.name, use.input)
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)


def test_count_tokens_is_the_prompt_of_create(client):
    count = client.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
    out = client.messages.create(model=MODEL, max_tokens=1, messages=ASK, system="Be brief.", extra_body=GREEDY)
    assert count.input_tokens == out.usage.input_tokens + out.usage.cache_read_input_tokens


def test_output_config_format_is_a_json_schema(client):
    out = client.messages.create(model=MODEL, max_tokens=60, messages=ASK, extra_body=GREEDY,
                                 output_config={"format": {"type": "json_schema", "schema": WEATHER}})
    if out.stop_reason == "end_turn":
        jsonschema.validate(json.loads(out.content[0].text), WEATHER)


def test_unknown_model_is_a_404_in_anthropic_shape(client):
    with pytest.raises(NotFoundError) as caught:
        client.messages.create(model="claude-x", max_tokens=8, messages=ASK)
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("body, field", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": ASK, "temperature": "hot"}, "temperature"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"max_tokens": 10**9, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": ASK, "mcp_servers": []}, "mcp_servers"),
])
def test_bad_input_is_a_400_in_anthropic_shape(default_server, body, field):
    response = httpx.post(f"{default_server.url}/v1/messages", json={"model": MODEL, **body}, timeout=60)
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["message"].startswith(field), payload


def test_client_that_leaves_mid_stream_is_aborted(default_server):
    url = f"{default_server.url}/v1/messages"
    body = {"model": MODEL, "max_tokens": 1000, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}
    aborted_before = aborted_count(default_server)
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if "text_delta" in line:
                break  # leaving the block closes the connection mid-stream
    gauges = wait_until_idle(default_server, aborted_before + 1)
    assert gauges["vllm:num_requests_running"] == 0
    assert aborted_count(default_server) == aborted_before + 1
