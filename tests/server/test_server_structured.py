"""Structured outputs through the real server and the OpenAI SDK: `chat.completions.parse` with
a pydantic model (greedy and sampled, streamed and not), sampled nested-schema outputs that all
validate, choice and regex outputs that always match (chat and completions), JSON mode, and a
max_tokens cut that ends with "length"."""
from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Describe a fictional person: name, age, favourite color, hobbies and address."}]


class Address(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]
    hobbies: list[str] = Field(min_length=1, max_length=3)
    address: Address


@pytest.fixture(scope="module")
def client(default_server):
    return OpenAI(base_url=f"{default_server.url}/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_parse_returns_the_pydantic_object(client, temperature):
    completion = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person,
                                               temperature=temperature, seed=3, max_tokens=250)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    with client.chat.completions.stream(model=MODEL, messages=ASK, response_format=Person, temperature=temperature,
                                        seed=3, max_tokens=250) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert isinstance(streamed.message.parsed, Person)
    assert streamed.message.content == choice.message.content  # same seed: the same text


def test_twenty_sampled_outputs_of_a_nested_schema_validate(client):
    schema = Person.model_json_schema()
    out = client.chat.completions.create(
        model=MODEL, messages=ASK, n=20, temperature=1.0, seed=11, max_tokens=250,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
    assert len(out.choices) == 20
    for c in out.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), schema)


def test_choice_and_regex_always_match(client):
    choices = ["positive", "negative", "neutral"]
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Sentiment of: 'what a film!'"}], n=8, temperature=1.0,
        seed=1, extra_body={"structured_outputs": {"choice": choices}})
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in out.choices)
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    out = client.completions.create(model=MODEL, prompt="Call me at ", n=8, temperature=1.0, seed=2, max_tokens=30,
                                    extra_body={"structured_outputs": {"regex": phone}})
    assert all(re.fullmatch(phone, c.text) and c.finish_reason == "stop" for c in out.choices), out.choices
    out = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0, stream=True,
                                         extra_body={"structured_outputs": {"regex": "[A-Z][a-z]+ is [0-9]{2}"}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in out if chunk.choices)
    assert re.fullmatch("[A-Z][a-z]+ is [0-9]{2}", text)


def test_json_mode_gives_an_object_and_a_cut_ends_with_length(client):
    out = client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                         max_tokens=300, temperature=0)
    c = out.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:
        assert c.finish_reason == "length" and c.message.content.startswith("{")
    cut = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": Person.model_json_schema()}})
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 5
    assert cut.choices[0].message.content.startswith("{")


def test_grammar_and_structural_tag_and_the_server_stays_idle(client, default_server):
    out = client.completions.create(model=MODEL, prompt="Answer yes or no:", max_tokens=10, temperature=1.0, n=4,
                                    extra_body={"structured_outputs": {"grammar": 'root ::= ("yes" | "no") "!"'}})
    assert all(c.text in ("yes!", "no!") for c in out.choices)
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "fixed text"}}
    out = client.completions.create(model=MODEL, prompt="Say:", max_tokens=10,
                                    extra_body={"structured_outputs": {"structural_tag": json.dumps(tag)}})
    assert out.choices[0].text == "fixed text"
    metrics = httpx.get(f"{default_server.url}/metrics").text
    assert re.search(r"^vllm:num_requests_running\S* 0\.0$", metrics, re.M), metrics
