"""Structured-outputs requests in the tokenizer worker (real tokenizer, real xgrammar, real ZMQ
queues): a grammar compiles before its request goes to the engine; one that does not compile,
or not within the time limit, is rejected naming its field and never reaches the engine; an
abort while it compiles sends nothing on. And the hermes tool prompt, rendered through
SmolLM2's own chat template."""
from __future__ import annotations

import json
import time

import pytest

from common.messages import (ChatMessage, ChatToolCall, EngineReady, GenerateRequest, PromptAccepted, RequestRejected,
                             SamplingParams, StructuredOutputs, ToEngine, ToServer)
from test_tokenizer_worker import Queues, prompts  # noqa: F401 - the module fixture
from tokenizer_worker.worker import AbortRequest, TokenizerWorker

READY = EngineReady(num_kv_tokens=4096, max_model_len=512, device="cpu", dtype="float32", vocab_size=49152,
                    model_dir="unused", eos_token_ids=[2], generation_defaults={})


def big_schema(tag: str, n: int = 600) -> str:
    """A schema of n enum properties (unique per tag, so xgrammar's cache never has it)."""
    props = {f"{tag}_{i}": {"enum": [f"v{i}_{j}_{tag}" for j in range(8)]} for i in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def make_worker(prompts, timeout_s: float):  # noqa: F811
    queues = Queues()
    w = TokenizerWorker(prompts, queues.to_server, queues.to_engine, timeout_s)
    w.on_engine_message(READY)
    queues.read(queues.server_in, ToServer)
    return w, queues


def wait_compiles(w, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while w.grammars.pending and time.monotonic() < deadline:
        time.sleep(0.005)
        w.on_compiles_done()


def request(rid: str, so: StructuredOutputs) -> GenerateRequest:
    return GenerateRequest(request_id=rid, sampling_params=SamplingParams(max_tokens=20, structured_outputs=so),
                           messages=[ChatMessage(role="user", content="Hi")])


def test_grammars_compile_before_the_engine_sees_them(prompts):  # noqa: F811
    w, q = make_worker(prompts, timeout_s=30)
    try:
        w.on_server_message(request("ok", StructuredOutputs("regex", "[a-z]{3}", "structured_outputs.regex")))
        w.on_server_message(request("bad", StructuredOutputs("grammar", "root ::= nope", "structured_outputs.grammar")))
        assert q.read(q.engine_in, ToEngine) == []  # dispatched only once the compile is seen done
        wait_compiles(w)
        to_server = q.read(q.server_in, ToServer)
        by_id = {m.request_id: m for m in to_server}
        assert isinstance(by_id["ok"], PromptAccepted)
        assert isinstance(by_id["bad"], RequestRejected) and by_id["bad"].status == 400
        assert by_id["bad"].param == "structured_outputs.grammar" and "nope" in by_id["bad"].message
        sent = q.read(q.engine_in, ToEngine)
        assert [m.request_id for m in sent] == ["0:ok"]
        assert sent[0].sampling_params.structured_outputs.spec == "[a-z]{3}"
    finally:
        q.close()


def test_a_slow_compile_is_refused_at_the_deadline_then_at_once_and_an_abort_sends_nothing(prompts):  # noqa: F811
    w, q = make_worker(prompts, timeout_s=0.001)
    try:
        w.on_server_message(request("slow", StructuredOutputs("json", big_schema("slow"), "response_format")))
        time.sleep(0.01)
        wait_compiles(w)
        [rejected] = q.read(q.server_in, ToServer)
        assert isinstance(rejected, RequestRejected) and rejected.param == "response_format"
        assert "did not compile within" in rejected.message
        # the same grammar again: refused at once (it may sit in the cache by now, but the engine's
        # compiler would take as long again, with no limit)
        w.on_server_message(request("again", StructuredOutputs("json", big_schema("slow"), "response_format")))
        w.on_compiles_done()
        [again] = q.read(q.server_in, ToServer)
        assert isinstance(again, RequestRejected) and "refused before" in again.message
        w.grammars.timeout_s = 60
        w.on_server_message(request("gone", StructuredOutputs("json", big_schema("gone"), "response_format")))
        w.on_server_message(AbortRequest(["gone"]))
        assert not w.grammars.pending
        assert q.read(q.engine_in, ToEngine) == [] and q.read(q.server_in, ToServer) == []
    finally:
        q.close()


def test_hermes_tool_prompt_through_the_models_template(prompts):  # noqa: F811
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [ChatMessage(role="user", content="Weather in Paris?"),
                ChatMessage(role="assistant", content="", tool_calls=[
                    ChatToolCall("call_1", "get_weather", '{"city": "Paris"}')]),
                ChatMessage(role="tool", content='{"t": 18}', tool_call_id="call_1"),
                ChatMessage(role="tool", content='{"t": 19}', tool_call_id="call_2")]
    assert not prompts.template_has_tools  # SmolLM2's template: our hermes prompt
    text = prompts.tokenizer.decode(prompts.chat_prompt_ids(messages, True, tools))
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(tools[0]) in text  # the signature, in <tools>
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>') in text
    assert ('<|im_start|>user\n<tool_response>\n{"t": 18}\n</tool_response>\n<tool_response>\n{"t": 19}\n'
            '</tool_response><|im_end|>\n<|im_start|>assistant\n') in text
    no_tools = prompts.tokenizer.decode(prompts.chat_prompt_ids(messages[:1], True))
    assert "# Tools" not in no_tools and "SmolLM" in no_tools  # the template's own default system turn


@pytest.mark.parametrize("system", [True, False])
def test_tool_instructions_join_an_existing_system_turn(prompts, system):  # noqa: F811
    tools = [{"type": "function", "function": {"name": "f"}}]
    messages = ([ChatMessage(role="system", content="Be brief.")] if system else []) + [
        ChatMessage(role="user", content="Hi")]
    text = prompts.tokenizer.decode(prompts.chat_prompt_ids(messages, True, tools))
    assert text.count("<|im_start|>system") == 1
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools" if system else "<|im_start|>system\n# Tools")
