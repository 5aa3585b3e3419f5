"""CORS (vLLM's flags), several --served-model-name aliases, and OpenAI's no-effect fields, on
one real server with an API key: a browser's preflight and cross-origin requests, every alias
accepted as `model`, and the fields real clients send accepted and ignored."""
from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from server_process import start_server

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

ORIGIN = "http://app.example:3000"
KEY = "sk-cors-test"
NAMES = ["smol", "SmolLM2-135M-Instruct", "team/chat-model"]
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    s = start_server("--served-model-name", *NAMES, "--api-key", KEY,
                     "--allowed-origins", f'["{ORIGIN}"]', "--allowed-methods", '["GET", "POST"]',
                     "--allowed-headers", '["Authorization", "Content-Type"]', "--allow-credentials")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_preflight_is_answered_without_the_key(server):
    """What a browser sends before a POST with a JSON body and a bearer token."""
    response = httpx.options(f"{server.url}/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert response.headers["access-control-allow-credentials"] == "true"
    assert set(response.headers["access-control-allow-methods"].split(", ")) >= {"GET", "POST"}
    assert "authorization" in response.headers["access-control-allow-headers"].lower()


def test_preflight_from_another_origin_or_method_is_refused(server):
    other = httpx.options(f"{server.url}/v1/models", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}, timeout=30)
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    method = httpx.options(f"{server.url}/v1/models", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "DELETE"}, timeout=30)
    assert method.status_code == 400


def test_cross_origin_request_gets_the_headers_on_answers_and_errors(server):
    ok = httpx.post(f"{server.url}/v1/completions", headers={"Origin": ORIGIN, **AUTH}, timeout=120,
                    json={"model": "smol", "prompt": "The sea is", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200, ok.text
    assert ok.headers["access-control-allow-origin"] == ORIGIN
    assert ok.headers["access-control-allow-credentials"] == "true"
    # The inner middleware's 401 carries them too, so the page can read the error body.
    denied = httpx.get(f"{server.url}/v1/models", headers={"Origin": ORIGIN}, timeout=30)
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    # An origin not on the list gets its answer (CORS is the browser's rule) but no header.
    other = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://evil.example", **AUTH}, timeout=30)
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


def test_every_alias_is_listed_and_accepted(server, client):
    assert [m.id for m in client.models.list().data] == NAMES
    for name in NAMES:
        assert client.models.retrieve(name).id == name
        out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=2, temperature=0)
        assert out.model == NAMES[0]  # the first name, as vLLM answers
    with pytest.raises(Exception) as refused:
        client.completions.create(model="other", prompt="Hi", max_tokens=2)
    assert getattr(refused.value, "status_code", None) == 404
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'vllm:prompt_tokens_total{model_name="smol"}' in metrics


def test_openai_fields_without_effect_are_accepted_and_ignored(client):
    """What the OpenAI SDK, the Agents SDK and proxies send: the same answer as without them."""
    messages = [{"role": "user", "content": "Name a color."}]
    plain = client.chat.completions.create(model="smol", messages=messages, max_tokens=8, temperature=0)
    fields = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=0, user="user-1", store=True,
        metadata={"team": "eval"}, service_tier="auto", safety_identifier="hash-1", prompt_cache_key="k",
        prompt_cache_retention="24h", verbosity="low", modalities=["text"], audio=None,
        prediction={"type": "content", "content": "Blue"}, stream_options=None,
        extra_body={"prompt_cache_options": {"mode": "implicit"}})
    assert fields.choices[0].message.content == plain.choices[0].message.content
    streamed = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=0, stream=True, store=False,
        stream_options={"include_usage": True, "include_obfuscation": False})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == plain.choices[0].message.content
    completion = client.completions.create(model="smol", prompt="Blue and", max_tokens=4, temperature=0, user="u",
                                           extra_body={"metadata": {"a": "b"}, "safety_identifier": "s"})
    assert completion.choices[0].text


def test_openapi_document_names_the_ignored_fields(server):
    schemas = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    for name in ("user", "store", "metadata", "service_tier", "safety_identifier", "prompt_cache_key",
                 "prompt_cache_retention", "prompt_cache_options", "verbosity", "prediction"):
        assert chat[name].get("x-ignored") is True, name
        assert "ignored" in chat[name]["description"], name
    assert schemas["CompletionRequest"]["properties"]["user"]["x-ignored"] is True


def test_agents_sdk_settings_that_mean_nothing_here_are_accepted(server):
    """The Agents SDK's chat-completions model sends store, metadata, verbosity and the prompt-cache
    settings when an agent sets them (its documented ModelSettings)."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="team/chat-model", openai_client=AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120))
    settings = ModelSettings(max_tokens=8, temperature=0, store=True, metadata={"run": "test"}, verbosity="low",
                             prompt_cache_retention="24h", prompt_cache_options={"mode": "implicit"})
    result = Runner.run_sync(Agent(name="brief", instructions="Answer in one word.", model=model,
                                   model_settings=settings), "Name a color.")
    assert isinstance(result.final_output, str) and result.final_output
