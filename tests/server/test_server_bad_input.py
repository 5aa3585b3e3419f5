"""Every bad input gets a 4xx with an OpenAI error body, never a 5xx, and never reaches the engine:
after all of them the server is healthy and the engine never saw a request."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from server_process import start_server
from strict_input_cases import STRICT_CASES, check_error_body, normal_request_still_served

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
OK_MESSAGES = [{"role": "user", "content": "Hi"}]
MARKER = "zq-do-not-echo-zq"  # put in bad values: must not come back in the error
HEAD_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def server():
    # Short read deadlines for the slow-client tests; every other request arrives at once.
    s = start_server("--header-read-timeout", str(HEAD_TIMEOUT_S), "--body-read-timeout", str(HEAD_TIMEOUT_S))
    yield s
    s.stop()


def chat(**fields) -> dict:
    return {"messages": OK_MESSAGES, "max_tokens": 4, **fields}


# (path, raw body or dict, the param the error must name (None: no check))
BAD_REQUESTS = [
    ("malformed json", CHAT, '{"messages": [', None),
    ("body is a list", CHAT, "[1, 2]", None),
    ("body is a string", CHAT, '"hello"', None),
    ("empty body", CHAT, "", None),
    ("missing messages", CHAT, {"max_tokens": 4}, "messages"),
    ("empty messages", CHAT, {"messages": []}, "messages"),
    ("messages not a list", CHAT, {"messages": MARKER}, "messages"),
    ("unknown role", CHAT, {"messages": [{"role": MARKER, "content": "Hi"}]}, "messages[0].role"),
    ("image content part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": MARKER}}]}]}, None),
    ("content missing", CHAT, {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("temperature negative", CHAT, chat(temperature=-1), "temperature"),
    ("temperature too high", CHAT, chat(temperature=3), "temperature"),
    ("temperature NaN", CHAT, '{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}', "temperature"),
    ("temperature 1e999", CHAT, '{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e999}',
     "temperature"),
    ("NaN with another error", CHAT, '{"messages": [], "temperature": NaN, "top_p": -Infinity}', None),
    ("top_p zero", CHAT, chat(top_p=0), "top_p"),
    ("top_p above one", CHAT, chat(top_p=1.5), "top_p"),
    ("presence_penalty", CHAT, chat(presence_penalty=2.5), "presence_penalty"),
    ("frequency_penalty", CHAT, chat(frequency_penalty=-2.5), "frequency_penalty"),
    ("repetition_penalty", CHAT, chat(repetition_penalty=0), "repetition_penalty"),
    ("min_p", CHAT, chat(min_p=1.5), "min_p"),
    ("top_k", CHAT, chat(top_k=-5), "top_k"),
    ("n zero", CHAT, chat(n=0), "n"),
    ("n above the cap", CHAT, chat(n=1000), "n"),
    ("n infinite", CHAT, '{"messages": [{"role": "user", "content": "Hi"}], "n": 1e999}', "n"),
    ("max_tokens negative", CHAT, chat(max_tokens=-1), "max_tokens"),
    ("max_tokens zero", CHAT, chat(max_tokens=0), "max_tokens"),
    ("max_tokens not a number", CHAT, chat(max_tokens=MARKER), "max_tokens"),
    ("max_tokens beyond 64 bits", CHAT, chat(max_tokens=10**30), "max_tokens"),
    ("max_completion_tokens negative", CHAT, chat(max_completion_tokens=-3), "max_tokens"),
    ("min_tokens above max_tokens", CHAT, chat(min_tokens=10), "min_tokens"),
    ("seed too large", CHAT, chat(seed=2**70), "seed"),
    ("empty stop string", CHAT, chat(stop=""), "stop"),
    ("empty stop in list", CHAT, chat(stop=["ok", ""]), "stop"),
    ("stop not a string", CHAT, chat(stop=5), "stop"),
    ("stop_token_ids outside vocabulary", CHAT, chat(stop_token_ids=[10**6]), "stop_token_ids"),
    ("logit_bias key not a token id", CHAT, chat(logit_bias={MARKER: 1}), "logit_bias"),
    ("logit_bias token outside vocabulary", CHAT, chat(logit_bias={"999999": 1}), "logit_bias"),
    ("logit_bias value out of range", CHAT, chat(logit_bias={"5": 1000}), "logit_bias"),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), "top_logprobs"),
    ("top_logprobs above 20", CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("stream_options without stream", CHAT, chat(stream_options={"include_usage": True}), "stream_options"),
    ("tool name outside OpenAI's pattern", CHAT, chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
     "tools[0].function.name"),
    ("tool_choice without tools", CHAT, chat(tool_choice="required"), "tool_choice"),
    ("tool_choice names no tool", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                             tool_choice={"type": "function", "function": {"name": "g"}}),
     "tool_choice"),
    ("duplicate tool names", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}] * 2), "tools"),
    ("tools with response_format", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                              response_format={"type": "json_object"}), "response_format"),
    ("response_format unknown type", CHAT, chat(response_format={"type": "yaml"}), "response_format.type"),
    ("json_schema without its object", CHAT, chat(response_format={"type": "json_schema"}),
     "response_format.json_schema"),
    ("json_schema that does not compile", CHAT,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}),
     "response_format.json_schema.schema"),
    ("regex that does not compile", CHAT, chat(structured_outputs={"regex": "[a-"}), "structured_outputs.regex"),
    ("grammar that does not compile", COMPLETIONS,
     {"prompt": "Hi", "structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar"),
    ("two structured outputs at once", CHAT, chat(structured_outputs={"regex": "a", "choice": ["a"]}),
     "structured_outputs"),
    ("empty choice list", CHAT, chat(structured_outputs={"choice": []}), "structured_outputs.choice"),
    ("structured outputs with min_tokens", CHAT, chat(max_tokens=5, min_tokens=2, structured_outputs={"regex": "a+"}),
     "min_tokens"),
    ("tool message without tool_call_id", CHAT, {"messages": [{"role": "tool", "content": "1"}]},
     "messages[0].tool_call_id"),
    ("tool_calls on a user message", CHAT, {"messages": [{"role": "user", "content": "1", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ("a null structured output", CHAT, chat(structured_outputs={"regex": None}), "structured_outputs"),
    ("null content on a user message", CHAT, {"messages": [{"role": "user", "content": None}]},
     "messages[0].content"),
    ("functions", CHAT, chat(functions=[{"name": "f"}]), "functions"),
    ("audio output", CHAT, chat(modalities=["text", "audio"]), "modalities"),
    ("moderation", CHAT, chat(moderation={"model": "omni-moderation-latest"}), "moderation"),
    ("an ignored field with a wrong type", CHAT, chat(store="yes"), "store"),
    ("verbosity outside OpenAI's values", CHAT, chat(verbosity="max"), "verbosity"),
    ("metadata values not strings", COMPLETIONS, {"prompt": "Hi", "metadata": {"a": 1}}, "metadata.a"),
    ("a router's field outside OpenAI's and vLLM's APIs", CHAT, chat(provider={"order": ["x"]}), "provider"),
    ("unknown field", CHAT, chat(frobnicate=1), "frobnicate"),
    ("unknown stream option", CHAT, chat(stream=True, stream_options={"include_usage": True, "x": 1}),
     "stream_options.x"),
    ("prompt plus max_tokens over max_model_len", CHAT, chat(max_tokens=2040), "messages"),
    ("prompt alone over max_model_len", CHAT, {"messages": [{"role": "user", "content": "hello " * 3000}]},
     "messages"),
    ("completions: prompt missing", COMPLETIONS, {"max_tokens": 4}, "prompt"),
    ("completions: empty prompt", COMPLETIONS, {"prompt": ""}, "prompt"),
    ("completions: token outside vocabulary", COMPLETIONS, {"prompt": [1, 2, 10**9]}, "prompt"),
    ("completions: token id beyond 64 bits", COMPLETIONS, {"prompt": [1, 2**80]}, "prompt"),
    ("completions: logprobs above 20", COMPLETIONS, {"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ("completions: max_tokens 0 without echo", COMPLETIONS, {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ("completions: echo as a string", COMPLETIONS, {"prompt": "Hi", "echo": "yes"}, "echo"),
    ("completions: prompt_logprobs above 20", COMPLETIONS, {"prompt": "Hi", "prompt_logprobs": 21},
     "prompt_logprobs"),
    ("completions: prompt_logprobs streamed", COMPLETIONS, {"prompt": "Hi", "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs"),
    ("chat: prompt_logprobs negative", CHAT, chat(prompt_logprobs=-1), "prompt_logprobs"),
    ("completions: suffix", COMPLETIONS, {"prompt": "Hi", "suffix": "x"}, "suffix"),
    ("completions: too many choices", COMPLETIONS, {"prompt": ["a", "b", "c"], "n": 50}, "prompt"),
    ("detokenize: token outside vocabulary", "/detokenize", {"tokens": [1, 10**7]}, "tokens"),
    ("tokenize: neither prompt nor messages", "/tokenize", {}, "prompt"),
]


@pytest.mark.parametrize("path, body, param", [r[1:] for r in BAD_REQUESTS], ids=[r[0] for r in BAD_REQUESTS])
def test_bad_request_is_400_with_openai_error_body(server, path, body, param):
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{server.url}{path}", content=content, headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"]
    assert MARKER not in response.text
    if param is not None:
        assert error["param"] == param, error
        assert param.split("[")[0].split(".")[0] in error["message"]


def test_too_long_prompt_error_gives_both_numbers(server):
    response = httpx.post(f"{server.url}{CHAT}", json=chat(max_tokens=2040), timeout=30)
    message = response.json()["error"]["message"]
    assert "2040" in message and "2048" in message, message


def test_unknown_model_is_404(server):
    response = httpx.post(f"{server.url}{CHAT}", json=chat(model="no-such-model"), timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"
    assert httpx.get(f"{server.url}/v1/models/no-such-model").status_code == 404


def test_unknown_route_and_wrong_method(server):
    assert httpx.get(f"{server.url}/v1/nothing-here").json()["error"]["code"] == 404
    assert httpx.get(f"{server.url}{CHAT}").status_code == 405


def test_huge_header_and_huge_body_are_refused(server):
    # A header block that never ends: without a size limit the server would keep reading it.
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 << 10))
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:  # refused while our bytes were still unread
            answer = b""
    assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), answer[:100]
    # A 40 MiB body is refused from its Content-Length, before a byte of it is read: the
    # answer comes although the body is never sent.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {40 << 20}\r\n\r\n".encode())
        answer = b""
        while b"}}" not in answer and (data := sock.recv(65536)):
            answer += data
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b'"code":413' in answer


@pytest.mark.parametrize("path, body, status, param", [c[1:] for c in STRICT_CASES], ids=[c[0] for c in STRICT_CASES])
def test_strict_parsing_refuses_with_4xx_naming_the_field(server, path, body, status, param):
    response = httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"},
                          timeout=60)
    assert response.status_code == status, response.text
    check_error_body(response, status, param)


def test_what_strictness_still_accepts(server):
    """Integers where a float is expected, and an escaped surrogate pair (an emoji): still
    served. /tokenize and the validation of a chat body stand in for generation, so the engine
    still sees no request in this module."""
    pair = httpx.post(f"{server.url}/tokenize", content=b'{"prompt": "\\ud83d\\ude00 ok"}', timeout=60,
                      headers={"content-type": "application/json"})
    assert pair.status_code == 200, pair.text
    plain = httpx.post(f"{server.url}/tokenize", json={"prompt": "\U0001F600 ok"}, timeout=60)
    assert pair.json()["tokens"] == plain.json()["tokens"]
    # Integers for temperature, top_p, presence_penalty and a logit_bias value pass validation:
    # the only complaint left is the prompt length (beyond max_model_len, checked last).
    numbers = {"messages": [{"role": "user", "content": "hello " * 3000}], "temperature": 0, "top_p": 1,
               "presence_penalty": 0, "logit_bias": {"5": 1}, "max_tokens": 4}
    response = httpx.post(f"{server.url}{CHAT}", json=numbers, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages", response.text


def test_oversized_header_sections_get_431_and_normal_ones_pass(server):
    one_big = httpx.get(f"{server.url}/health", headers={"X-Big": "a" * (64 << 10)}, timeout=30)
    assert one_big.status_code == 431
    check_error_body(one_big, 431, None)
    # httpx adds 5 fields (host, accept, accept-encoding, connection, user-agent): 100 in all pass.
    fields = [(f"X-H{i}", "1") for i in range(95)]
    assert httpx.get(f"{server.url}/health", headers=fields, timeout=30).status_code == 200
    many = httpx.get(f"{server.url}/health", headers=[*fields, ("X-One-More", "1")], timeout=30)
    assert many.status_code == 431 and "101 header fields" in many.json()["error"]["message"]
    # What a real client may send: a 8 KiB cookie, a 4 KiB bearer token, 60 fields in all.
    normal = [("Cookie", "c=" + "x" * 8192), ("Authorization", "Bearer " + "t" * 4096)]
    normal += [(f"X-Trace-{i}", "v" * 40) for i in range(58)]
    assert httpx.get(f"{server.url}/health", headers=normal, timeout=30).status_code == 200


def test_header_section_sent_in_pieces_gets_431(server):
    """A head that grows past the limit over several reads is stopped by the protocol's limit."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        try:
            for _ in range(40):  # 40 KiB of header lines, 1 KiB per write
                sock.sendall(b"X-Pad: " + b"p" * 1014 + b"\r\n")
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before we finished
        while data := sock.recv(65536):
            answer += data
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b'"code":431' in answer


def test_slow_loris_clients_time_out_and_hold_nothing(server):
    """20 clients that send their head a byte at a time, one idle connection, one body that
    stops: each is cut with a 408 that names the deadline (the idle one silently), while the
    server keeps answering others, and nothing of theirs reaches the engine. (When the cut comes
    is the server's clock against the flags; the loop below only bounds how long it waits.)"""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(20)]
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    stalled_body = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    stalled_body.sendall(head + b"Content-Length: 100\r\n\r\n" + b'{"messages": [')
    started = time.monotonic()
    cut: set[int] = set()
    position = 0
    while len(cut) < len(slow) and time.monotonic() - started < 20 * HEAD_TIMEOUT_S:  # a bound, not a figure
        for i, sock in enumerate(slow):
            if i not in cut:
                try:
                    sock.sendall(head[position % len(head): position % len(head) + 1])
                except OSError:
                    cut.add(i)
        position += 1
        normal_request_still_served(server)
        time.sleep(0.2)
    answers = [_read_to_close(sock) for sock in slow]
    assert len(cut) == len(slow), f"only {len(cut)} of {len(slow)} slow clients were cut"
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
    assert all(f"did not arrive within {HEAD_TIMEOUT_S} s".encode() in a for a in answers), answers[0][-300:]
    assert _read_to_close(idle) == b""  # closed with no answer: it never asked anything
    body_answer = _read_to_close(stalled_body)
    assert body_answer.startswith(b"HTTP/1.1 408") and b"request body stopped arriving" in body_answer
    assert b"connection: close" in body_answer.lower()
    normal_request_still_served(server)


def _read_to_close(sock: socket.socket) -> bytes:
    answer = b""
    with sock:
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
    return answer


def test_server_still_healthy_and_engine_never_saw_a_bad_request(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'vllm:prompt_tokens_total{model_name="SmolLM2-135M-Instruct"} 0.0' in metrics
    ok = httpx.post(f"{server.url}{CHAT}", json=chat(temperature=0), timeout=120)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
