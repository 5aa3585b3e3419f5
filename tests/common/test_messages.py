"""Every cross-process message survives msgpack, and each socket's decoder tells them apart."""
from __future__ import annotations

import msgspec
import pytest

from common.messages import (AbortRequest, ChatMessage, DetokenizeRequest, DetokenizeResponse, EngineOutputs,
                             EngineReady, EngineRequest, EngineStats, FromEngine, GenerateRequest, ProcessError,
                             PromptAccepted, RequestRejected, RooflineStats, SamplingParams, TextDelta, TextLogprob,
                             TextOutputs, TokenDelta, TokenizeRequest, TokenizeResponse, TokenLogprob, ToEngine,
                             ToServer, ToTokenizerWorker, Usage)

PARAMS = SamplingParams(n=2, max_tokens=7, min_tokens=1, temperature=0.5, top_k=5, top_p=0.9, min_p=0.1,
                        repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=-0.3,
                        logit_bias={5: -1.5}, seed=2**63, logprobs=3, stop_token_ids=[2], ignore_eos=True,
                        stop=["\n\n", "END"], include_stop_str_in_output=True, skip_special_tokens=False)
STATS = EngineStats(num_running=3, num_waiting=1, kv_cache_usage=0.25, prefix_cache_queries=100,
                    prefix_cache_hits=32, num_preemptions=1, queue_times=[0.01, 0.5],
                    roofline=RooflineStats([0.5, 0.25], [0.01, 0.02], {"attention": 0.001, "lm_head": 0.002}, 0.1))
LOGPROB = TextLogprob("é", [0xC3, 0xA9], -0.5, [TextLogprob("e", [0x65], -1.0)])

# (message, the union of the socket it travels on)
MESSAGES = [
    (EngineRequest("0:r1", [1, 2, 3], PARAMS), ToEngine),
    (AbortRequest(["0:r1", "1:r1"]), ToEngine),
    (EngineOutputs([TokenDelta("0:r1", [9], [[TokenLogprob(9, -0.1), TokenLogprob(4, -2.0)]], "stop", 2, 1),
                    TokenDelta("x", [], finish_reason="error", error="prompt: too long")], STATS), FromEngine),
    (EngineOutputs([]), FromEngine),
    (EngineReady(num_kv_tokens=4096, max_model_len=2048, vocab_size=49152, device="cpu", dtype="float32",
                 model_dir="/m", eos_token_ids=[2], generation_defaults={"temperature": 0.6, "max_tokens": 100}),
     FromEngine),
    (ProcessError("engine", "RuntimeError: boom"), FromEngine),
    (GenerateRequest(request_id="r1", sampling_params=PARAMS, messages=[
        ChatMessage(role="user", content="你好 😀"), ChatMessage(role="assistant", content="hi", name="bot")]),
     ToTokenizerWorker),
    (GenerateRequest(request_id="r2", sampling_params=SamplingParams(), prompts=["text", [1, 2, 3]]),
     ToTokenizerWorker),
    (AbortRequest(["r1"]), ToTokenizerWorker),
    (TokenizeRequest(request_id="t1", prompt="hi", add_special_tokens=False, return_token_strs=True),
     ToTokenizerWorker),
    (DetokenizeRequest("t2", [1, 2]), ToTokenizerWorker),
    (TextOutputs([TextDelta("r1", 1, "é", 2, "stop", "END", [LOGPROB], Usage(10, 4, 2)),
                  TextDelta("r1", 0, "", 1, "stop", 2)], STATS), ToServer),
    (PromptAccepted("r1", 31), ToServer),
    (RequestRejected("r1", "messages: too long", "messages"), ToServer),
    (TokenizeResponse("t1", [5, 6], ["a", "b"]), ToServer),
    (DetokenizeResponse("t2", "hello"), ToServer),
    (EngineReady(num_kv_tokens=1, max_model_len=1, vocab_size=2, device="cuda:0", dtype="bfloat16", model_dir="/m",
                 eos_token_ids=[0, 1], generation_defaults={}), ToServer),
    (ProcessError("tokenizer_worker", "x"), ToServer),
]


@pytest.mark.parametrize("message, union", MESSAGES, ids=[f"{type(m).__name__}-{i}" for i, (m, _) in
                                                          enumerate(MESSAGES)])
def test_round_trip_through_the_socket_decoder(message, union):
    wire = msgspec.msgpack.Encoder().encode(message)
    decoded = msgspec.msgpack.Decoder(union).decode(wire)
    assert type(decoded) is type(message) and decoded == message


def test_a_message_for_another_socket_is_refused():
    wire = msgspec.msgpack.encode(TextOutputs([]))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(ToEngine).decode(wire)
    with pytest.raises(msgspec.DecodeError):
        msgspec.msgpack.Decoder(ToServer).decode(b"\xc1 not msgpack")


def test_messages_module_has_no_torch():
    import subprocess
    import sys

    code = "import sys, common.messages; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
