"""The tokenizer worker between real ZMQ sockets, with the default model's real tokenizer; this
test plays the server and the engine on the other ends of the queues."""
from __future__ import annotations

import msgspec
import pytest
import zmq

from common.default_model import ensure_default_model
from common.ipc import Channel, IpcPaths, open_socket
from common.messages import (AbortRequest, ChatMessage, EngineOutputs, EngineReady, EngineRequest, EngineStats,
                             GenerateRequest, PromptAccepted, RequestRejected, SamplingParams, TextOutputs,
                             TokenDelta, ToEngine, ToServer)
from tokenizer_worker.prompts import PromptTokenizer
from tokenizer_worker.worker import TokenizerWorker

STATS = EngineStats(num_running=1, num_waiting=0, kv_cache_usage=0.1, prefix_cache_queries=0, prefix_cache_hits=0,
                    num_preemptions=0)


class Queues:
    """The worker's two output queues, read back here."""

    def __init__(self):
        self.paths = IpcPaths.create()
        self.ctx = zmq.Context()
        self.server_in = open_socket(self.ctx, zmq.PULL, self.paths.to_server, bind=True)
        self.engine_in = open_socket(self.ctx, zmq.PULL, self.paths.to_engine, bind=True)
        self.to_server = Channel(open_socket(self.ctx, zmq.PUSH, self.paths.to_server, bind=False))
        self.to_engine = Channel(open_socket(self.ctx, zmq.PUSH, self.paths.to_engine, bind=False))

    def read(self, sock, union) -> list:
        decoder = msgspec.msgpack.Decoder(union)
        out = []
        while sock.poll(200):
            out.append(decoder.decode(sock.recv()))
        return out

    def close(self):
        for s in (self.server_in, self.engine_in):
            s.close(linger=0)
        self.to_server.close()
        self.to_engine.close()
        self.ctx.term()
        self.paths.remove()


@pytest.fixture(scope="module")
def prompts():
    return PromptTokenizer(str(ensure_default_model()))


@pytest.fixture
def worker(prompts):
    queues = Queues()
    w = TokenizerWorker(prompts, queues.to_server, queues.to_engine)
    w.on_engine_message(EngineReady(num_kv_tokens=4096, max_model_len=64, device="cpu", dtype="float32",
                                    vocab_size=49152, model_dir="unused", eos_token_ids=[2],
                                    generation_defaults={}))
    assert isinstance(queues.read(queues.server_in, ToServer)[0], EngineReady)  # forwarded to the server
    yield w, queues
    queues.close()


def test_stop_string_across_tokens_aborts_the_choice_in_the_engine(worker, prompts):
    w, q = worker
    params = SamplingParams(n=2, max_tokens=20, stop=["lo wor"])
    w.on_server_message(GenerateRequest(request_id="r", sampling_params=params,
                                        messages=[ChatMessage(role="user", content="Hi")]))
    sent = q.read(q.engine_in, ToEngine)
    assert [type(m) for m in sent] == [EngineRequest, EngineRequest]
    assert [m.request_id for m in sent] == ["0:r", "1:r"] and sent[0].sampling_params.n == 1
    accepted = q.read(q.server_in, ToServer)
    assert accepted == [PromptAccepted("r", len(sent[0].prompt_token_ids))]

    ids = prompts.tokenizer.encode(" hello world again", add_special_tokens=False)
    assert len(ids) == 3
    # Choice 0 gets its tokens one by one: "lo wor" spans the boundary of " hello" and " world".
    for token in ids:
        w.on_engine_message(EngineOutputs([TokenDelta("0:r", [token])], STATS))
    outputs = [m for m in q.read(q.server_in, ToServer) if isinstance(m, TextOutputs)]
    deltas = [d for m in outputs for d in m.deltas]
    assert "".join(d.text for d in deltas) == " hel"
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == "lo wor"
    assert q.read(q.engine_in, ToEngine) == [AbortRequest(["0:r"])]  # told at once, once
    assert all(m.stats == STATS for m in outputs)  # gauges passed through

    # Late tokens of the stopped choice are dropped; the other choice ends the request with usage.
    other = prompts.tokenizer.encode(" good day", add_special_tokens=False)
    w.on_engine_message(EngineOutputs([TokenDelta("0:r", [ids[0]]),
                                       TokenDelta("1:r", other, finish_reason="length", num_cached_tokens=16)]))
    (last,) = [d for m in q.read(q.server_in, ToServer) for d in m.deltas]
    assert (last.index, last.text, last.finish_reason) == (1, " good day", "length")
    assert last.usage.prompt_tokens == len(sent[0].prompt_token_ids)  # one prompt, counted once for n=2
    # Choice 0 counts the two tokens up to its stop; " again" came after it and was dropped.
    assert last.usage.completion_tokens == 2 + len(other) and last.usage.cached_tokens == 16
    assert w.requests == {} and w.children == {}


def test_unknown_and_duplicate_ids_are_dropped(worker):
    w, q = worker
    w.on_engine_message(EngineOutputs([TokenDelta("0:nobody", [5], finish_reason="stop")]))
    w.on_server_message(AbortRequest(["nobody"]))
    assert q.read(q.server_in, ToServer) == [] and q.read(q.engine_in, ToEngine) == []


def test_client_abort_reaches_every_unfinished_choice(worker):
    w, q = worker
    w.on_server_message(GenerateRequest(request_id="a", sampling_params=SamplingParams(n=3, max_tokens=5),
                                        prompts=["One", "Two"]))
    assert len(q.read(q.engine_in, ToEngine)) == 6
    w.on_engine_message(EngineOutputs([TokenDelta("4:a", [5], finish_reason="stop")]))
    w.on_server_message(AbortRequest(["a"]))
    aborts = q.read(q.engine_in, ToEngine)
    assert aborts == [AbortRequest(["0:a", "1:a", "2:a", "3:a", "5:a"])]
    assert w.requests == {} and w.children == {}


def test_bad_prompts_are_rejected_before_the_engine(worker):
    w, q = worker
    long_prompt = "word " * 100  # more than max_model_len 64 tokens
    w.on_server_message(GenerateRequest(request_id="b", sampling_params=SamplingParams(), prompts=[long_prompt]))
    w.on_server_message(GenerateRequest(request_id="c", sampling_params=SamplingParams(max_tokens=60),
                                        messages=[ChatMessage(role="user", content="Hi there")]))
    w.on_server_message(GenerateRequest(request_id="d", sampling_params=SamplingParams(), prompts=[[1, 10**6]]))
    rejected = q.read(q.server_in, ToServer)
    assert [type(m) for m in rejected] == [RequestRejected] * 3
    assert [m.param for m in rejected] == ["prompt", "messages", "prompt"]
    assert "max_model_len 64" in rejected[1].message and "60" in rejected[1].message
    assert q.read(q.engine_in, ToEngine) == []


def test_cached_tokens_come_with_the_first_delta_only(worker, prompts):
    w, q = worker
    w.on_server_message(GenerateRequest(request_id="k", sampling_params=SamplingParams(max_tokens=3),
                                        prompts=["Hello"]))
    (sent,) = q.read(q.engine_in, ToEngine)
    token = prompts.tokenizer.encode(" a", add_special_tokens=False)[0]
    w.on_engine_message(EngineOutputs([TokenDelta("0:k", [token], num_cached_tokens=16)]))
    w.on_engine_message(EngineOutputs([TokenDelta("0:k", [token])]))
    w.on_engine_message(EngineOutputs([TokenDelta("0:k", [token], finish_reason="length")]))
    deltas = [d for m in q.read(q.server_in, ToServer) if isinstance(m, TextOutputs) for d in m.deltas]
    assert deltas[-1].usage.cached_tokens == 16 and deltas[-1].usage.completion_tokens == 3
    assert deltas[-1].usage.prompt_tokens == len(sent.prompt_token_ids)


@pytest.mark.parametrize("detokenize_check", [True, False])
def test_the_stream_self_check_reaches_the_wire_and_can_be_off(prompts, detokenize_check):
    q = Queues()
    try:
        w = TokenizerWorker(prompts, q.to_server, q.to_engine, detokenize_check=detokenize_check)
        w.on_engine_message(EngineReady(num_kv_tokens=4096, max_model_len=64, device="cpu", dtype="float32",
                                        vocab_size=49152, model_dir="unused", eos_token_ids=[2],
                                        generation_defaults={}))
        w.on_server_message(GenerateRequest(request_id="s", sampling_params=SamplingParams(max_tokens=9),
                                            prompts=["Say"]))
        ids = prompts.tokenizer.encode(" 你好 🙂 done", add_special_tokens=False)
        assert [c.stream_check is not None for c in w.requests["s"].choices.values()] == [detokenize_check]
        for i, token in enumerate(ids):
            w.on_engine_message(EngineOutputs([TokenDelta("0:s", [token], finish_reason=(
                "length" if i == len(ids) - 1 else None))]))
        deltas = [d for m in q.read(q.server_in, ToServer) if isinstance(m, TextOutputs) for d in m.deltas]
        assert "".join(d.text for d in deltas) == " 你好 🙂 done"
        assert not any(d.detokenize_mismatch for d in deltas) and deltas[-1].finish_reason == "length"
    finally:
        q.close()
