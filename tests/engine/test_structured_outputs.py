"""Grammar-constrained decoding through the real engine (default model, fp32, xgrammar): outputs
follow their grammar, unconstrained requests batched with constrained ones keep the text they
have alone, a max_tokens cut ends with "length", and preemption or abort leaves no request (and
so no matcher) behind."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from common.messages import SamplingParams, StructuredOutputs
from common.structured_outputs import choice_spec, json_object_spec, json_schema_spec
from engine.llm import LLM

pytestmark = pytest.mark.slow  # the real model under grammars, at batch 16 and 32

# bounded strings and arrays: a 135M model may otherwise repeat list items until max_tokens
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}},
    "required": ["name", "age", "color", "tags"]}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
QUESTIONS = ["Describe a person as JSON.", "Is 'what a great film' positive or negative?", "Give me a phone number.",
             "Write JSON about a cat.", "What is the capital of France?", "Write a haiku about the sea.",
             "List three prime numbers.", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", device="cpu", kv_cache_memory=256 << 20, max_model_len=1024, max_num_seqs=16)


def chat(llm: LLM, question: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)


def constrained(kind: int, **kw) -> SamplingParams:
    spec = [json_schema_spec(PERSON, "p"), choice_spec(["positive", "negative"], "c"),
            StructuredOutputs("regex", PHONE), json_object_spec("j")][kind % 4]
    return SamplingParams(max_tokens=160, structured_outputs=spec, **kw)


def check(kind: int, text: str) -> None:
    if kind % 4 == 0:
        jsonschema.validate(json.loads(text), PERSON)
    elif kind % 4 == 1:
        assert text in ("positive", "negative")
    elif kind % 4 == 2:
        assert re.fullmatch(PHONE, text), text
    else:
        assert isinstance(json.loads(text), dict)


def test_mixed_batch_follows_grammars_and_leaves_the_others_alone(llm):
    # 16 requests: 8 constrained (every kind twice, greedy and sampled), 8 unconstrained greedy
    prompts = [chat(llm, QUESTIONS[i % 4]) for i in range(8)] + [chat(llm, QUESTIONS[4 + i % 4]) for i in range(8)]
    params = [constrained(i, temperature=0 if i < 4 else 1.0, seed=i) for i in range(8)]
    params += [SamplingParams(temperature=0, max_tokens=32) for _ in range(8)]
    outs = llm.generate(prompts, params)
    for i in range(8):
        out = outs[i].outputs[0]
        if i % 4 == 3 and out.finish_reason == "length":  # free JSON (any object) may ramble on
            assert out.text.startswith("{")
            continue
        assert out.finish_reason == "stop", out
        check(i, out.text)
    alone = llm.generate(prompts[8:], params[8:])
    assert [o.outputs[0].text for o in outs[8:]] == [o.outputs[0].text for o in alone]
    one_by_one = [llm.generate(p, s)[0].outputs[0].text for p, s in zip(prompts[8:10], params[8:10], strict=True)]
    assert one_by_one == [o.outputs[0].text for o in outs[8:10]]
    assert not llm.engine.requests


def test_sampled_nested_schema_always_validates(llm):
    params = SamplingParams(n=12, temperature=1.0, seed=7, max_tokens=160, structured_outputs=json_schema_spec(
        PERSON, "p"))
    out = llm.generate(chat(llm, QUESTIONS[0]), params)[0]
    for c in out.outputs:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.text), PERSON)


def test_max_tokens_cut_ends_with_length_and_keeps_a_prefix(llm):
    out = llm.generate(chat(llm, QUESTIONS[0]), SamplingParams(temperature=0, max_tokens=6, structured_outputs=(
        json_schema_spec(PERSON, "p"))))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6
    assert out.text.startswith("{")


def test_preemption_keeps_the_grammar_and_abort_leaves_nothing():
    # a KV cache of 20 blocks x 16 tokens for 12 requests of ~40 prompt + up to 160 output tokens
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory=20 * 16 * 30 * 2 * 3 * 64 * 4, max_model_len=256,
              max_num_seqs=12)
    prompts = [chat(llm, QUESTIONS[i % 4]) for i in range(12)]
    params = [constrained(i, temperature=1.0, seed=i) for i in range(12)]
    outs = llm.generate(prompts, params)
    assert llm.engine.scheduler.num_preemptions > 0
    for i, o in enumerate(outs):
        if o.outputs[0].finish_reason == "stop":
            check(i, o.outputs[0].text)
    engine = llm.engine
    ids = llm.tokenizer.encode(prompts[0], add_special_tokens=False)
    for i in range(4):
        engine.add_request(f"a{i}", ids, constrained(0, temperature=1.0, seed=i))
    for _ in range(5):
        engine.step()
    for i in range(4):
        engine.abort(f"a{i}")
    assert not engine.requests and engine.block_manager.usage == 0.0


def test_a_compiling_grammar_lets_other_requests_pass(llm):
    engine = llm.engine
    props = {f"k{i}": {"enum": [f"v{i}_{j}" for j in range(8)]} for i in range(600)}  # unique: no cache hit
    slow = StructuredOutputs("json", json.dumps({"type": "object", "properties": props}), "p")
    ids = llm.tokenizer.encode(chat(llm, QUESTIONS[0]), add_special_tokens=False)
    engine.add_request("slow", ids, SamplingParams(temperature=0, max_tokens=8, structured_outputs=slow))
    engine.add_request("plain", ids, SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    scheduler = engine.scheduler
    assert [r.request_id for r in scheduler.running] == ["plain"] and scheduler.waiting[0].request_id == "slow"
    while engine.has_unfinished():
        engine.step()
    assert not engine.requests
