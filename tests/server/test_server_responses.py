"""/v1/responses through the real server and the OpenAI SDK: create, stream (the event sequence
`responses.stream()` reads, equal to the non-streamed answer at temperature 0), parse into a
pydantic model, a function tool round trip through previous_response_id, GET of a stored
response, `incomplete` at max_output_tokens, bad input as 4xx naming the field, and a client
that leaves mid-stream has its request aborted."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from openai import NotFoundError, OpenAI
from pydantic import BaseModel

from test_server_streams import aborted_count, wait_until_idle

pytestmark = pytest.mark.slow  # a real server process (and the model) per session

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": WEATHER}]


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def client(default_server):
    return OpenAI(base_url=f"{default_server.url}/v1", api_key="none", max_retries=0)


def test_create_answers_text_with_usage(client):
    out = client.responses.create(model=MODEL, input="What is the capital of France?", instructions="Be brief.",
                                  max_output_tokens=24, temperature=0)
    assert out.object == "response" and out.id.startswith("resp_") and out.status in ("completed", "incomplete")
    assert out.output_text.strip()
    assert [item.type for item in out.output] == ["message"]
    assert out.usage.input_tokens > 0 and 0 < out.usage.output_tokens <= 24
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.instructions == "Be brief." and out.max_output_tokens == 24


def test_incomplete_at_max_output_tokens(client):
    out = client.responses.create(model=MODEL, input="Write a long story about a dragon.", max_output_tokens=5,
                                  temperature=0)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 5 and out.output_text


def test_stream_events_equal_the_non_streamed_answer(client):
    args = dict(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}],
                max_output_tokens=60, temperature=0)
    whole = client.responses.create(**args)
    assert whole.status == "completed"  # the SDK's get_final_response wants response.completed
    with client.responses.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == final.output_text
    assert final.status == whole.status and final.usage.output_tokens == whole.usage.output_tokens


def test_parse_into_a_pydantic_model(client):
    out = client.responses.parse(model=MODEL, input="Invent a city.", text_format=City, max_output_tokens=80,
                                 temperature=0)
    assert isinstance(out.output_parsed, City) and out.output_parsed.name


def test_json_object_format(client):
    out = client.responses.create(model=MODEL, input="Describe a cat as JSON.", max_output_tokens=60, temperature=0,
                                  text={"format": {"type": "json_object"}})
    if out.status == "completed":
        assert isinstance(json.loads(out.output_text), dict)


def test_function_tool_round_trip_through_previous_response_id(client, default_server):
    first = client.responses.create(model=MODEL, input="What's the weather in Paris?", tools=TOOLS,
                                    tool_choice="required", max_output_tokens=80, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS, max_output_tokens=30, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21}'}])
    assert second.previous_response_id == first.id and second.output_text.strip()
    # the second turn saw the whole conversation: its prompt holds the first turn and the result
    assert second.usage.input_tokens > first.usage.input_tokens
    stored = client.responses.retrieve(second.id)
    assert stored.id == second.id and stored.output_text == second.output_text
    with pytest.raises(NotFoundError):
        client.responses.retrieve("resp_unknown")
    missing = httpx.post(f"{default_server.url}/v1/responses", json={"input": "hi", "previous_response_id": "resp_x"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "previous_response_id"


def test_streamed_function_call_equals_the_non_streamed_one(client):
    args = dict(model=MODEL, input="What's the weather in Rome?", tools=TOOLS, max_output_tokens=80, temperature=0,
                tool_choice={"type": "function", "name": "get_weather"})
    whole = client.responses.create(**args)
    with client.responses.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (call,) = [item for item in whole.output if item.type == "function_call"]
    fragments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert fragments == call.arguments
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [call.arguments]


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "max_output_tokens": 10**9}, "max_output_tokens"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
     "text.format"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": "hi", "unknown_field": 1}, "unknown_field"),
])
def test_bad_input_is_a_400_naming_the_field(default_server, body, param):
    response = httpx.post(f"{default_server.url}/v1/responses", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_client_that_leaves_mid_stream_is_aborted(default_server):
    url = f"{default_server.url}/v1/responses"
    body = {"input": "Write a very long story about a dragon.", "max_output_tokens": 1000, "temperature": 0,
            "stream": True}
    aborted_before = aborted_count(default_server)
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if "response.output_text.delta" in line:
                break  # leaving the block closes the connection mid-stream
    gauges = wait_until_idle(default_server, aborted_before + 1)
    assert gauges["vllm:num_requests_running"] == 0
    assert aborted_count(default_server) == aborted_before + 1
