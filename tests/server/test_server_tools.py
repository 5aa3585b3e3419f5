"""Tool calling through the real server and the OpenAI SDK: `required` and a named function
return calls whose arguments validate against the tool's schema, parallel_tool_calls false gives
exactly one call, `none` gives none, streamed tool-call deltas reassemble to the non-streamed
answer, and a conversation with a call and its result renders back into the prompt."""
from __future__ import annotations

import json

import jsonschema
import pytest
from openai import OpenAI

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather in Paris, and what time is it in Tokyo?"}]


@pytest.fixture(scope="module")
def client(default_server):
    return OpenAI(base_url=f"{default_server.url}/v1", api_key="none", max_retries=0)


def create(client, **kw):
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200, temperature=0)
    args.update(kw)
    return client.chat.completions.create(**args)


def check_calls(message) -> list:
    calls = message.tool_calls
    assert calls, message
    assert len({c.id for c in calls}) == len(calls) and all(c.id.startswith("call_") for c in calls)
    for c in calls:
        assert c.type == "function"
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_required_returns_valid_calls(client, temperature):
    out = create(client, tool_choice="required", temperature=temperature, seed=5, n=4 if temperature else 1)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        check_calls(choice.message)


def test_parallel_tool_calls_false_gives_exactly_one(client):
    out = create(client, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=2, n=4)
    for choice in out.choices:
        assert len(check_calls(choice.message)) == 1


def test_named_function_is_the_one_called(client):
    out = create(client, tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0, seed=3,
                 n=3)
    for choice in out.choices:
        calls = check_calls(choice.message)
        # a forced function ends with "stop" (OpenAI's and vLLM's answer), not "tool_calls"
        assert [c.function.name for c in calls] == ["get_time"] and choice.finish_reason == "stop"


def test_none_gives_no_calls(client):
    out = create(client, tool_choice="none", max_tokens=30)
    message = out.choices[0].message
    assert not message.tool_calls and message.content and out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_deltas_reassemble_to_the_whole_answer(client, tool_choice):
    whole = create(client, tool_choice=tool_choice).choices[0]
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in create(client, tool_choice=tool_choice, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for d in delta.tool_calls or []:
            if d.index not in calls:  # the first delta of a call: id, type, name, empty arguments
                assert d.id and d.type == "function" and d.function.name and d.function.arguments == ""
                calls[d.index] = {"name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason == ("tool_calls" if tool_choice == "required" else "stop")
    assert (content or None) == whole.message.content  # null: nothing but calls (and the newline between)
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_a_tool_round_trip_renders(client, default_server):
    first = create(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    call = first.message.tool_calls[0]
    result = json.dumps({"city": "Paris", "temperature": 18, "unit": "celsius"})
    conversation = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": result}]
    out = create(client, messages=conversation, tool_choice="none", max_tokens=40)
    assert out.choices[0].message.content
    # the call and the result are in the prompt: more tokens than the question alone, and more
    # than the conversation without the result
    without_result = create(client, messages=conversation[:-1], tool_choice="none", max_tokens=1)
    asked = create(client, tool_choice="none", max_tokens=1)
    assert out.usage.prompt_tokens > without_result.usage.prompt_tokens > asked.usage.prompt_tokens
