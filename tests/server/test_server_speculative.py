"""The real server with n-gram speculative decoding: greedy answers equal the engine's without
speculation (offline, same model and dtype), streamed text equals the whole text, stop strings
cut inside accepted drafts, and /metrics carries vLLM's spec_decode counters."""
from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from common.messages import SamplingParams
from benchmarks.grounded import grounded_messages
from engine.llm import LLM
from server_process import start_server

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


@pytest.fixture(scope="module")
def server():
    s = start_server("--speculative-config", json.dumps(SPEC))
    yield s
    s.stop()


def metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


def test_greedy_answers_equal_the_engine_without_speculation(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    conversations = grounded_messages()[:3]
    reference = LLM(dtype="float32", device="cpu", kv_cache_memory=128 << 20, max_model_len=2048)
    prompts = [reference.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
               for c in conversations]
    want = reference.generate(prompts, SamplingParams(temperature=0, max_tokens=64))
    drafts_before = metric(server, "vllm:spec_decode_num_drafts_total")
    for conversation, expected in zip(conversations, want, strict=True):
        out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=conversation, max_tokens=64,
                                             temperature=0)
        assert out.choices[0].message.content == expected.outputs[0].text
        assert out.usage.completion_tokens == len(expected.outputs[0].token_ids)
        stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=conversation, max_tokens=64,
                                                temperature=0, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.outputs[0].text
        assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    assert metric(server, "vllm:spec_decode_num_drafts_total") > drafts_before
    accepted = metric(server, "vllm:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= metric(server, "vllm:spec_decode_num_draft_tokens_total")
    assert metric(server, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted


def test_stop_string_inside_a_draft(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    conversation = grounded_messages()[0]  # "Repeat the following text exactly": the drafts copy it
    whole = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=conversation, max_tokens=80,
                                           temperature=0).choices[0].message.content
    assert "harbour" in whole
    cut = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=conversation, max_tokens=80,
                                         temperature=0, stop=["harbour"]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == whole[: whole.index("harbour")]
