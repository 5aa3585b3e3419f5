"""Bodies that strict parsing refuses (`server.json_body`, strict pydantic models), each with the
status and the param the error must name, and the checks the bad-input tests share."""
from __future__ import annotations

import json

import httpx

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat_raw(fields: str) -> bytes:
    """A valid chat body with raw JSON `fields` added (escapes stay escapes on the wire)."""
    return ('{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4' + (", " + fields if fields else "")
            + "}").encode()


def nested(depth: int) -> bytes:
    return ('{"messages": [{"role": "user", "content": "Hi"}], "x": ' + "[" * depth + "]" * depth + "}").encode()


# (id, path, raw body, status, param (None: the body as a whole))
STRICT_CASES: list[tuple[str, str, bytes, int, str | None]] = [
    # Unicode: a lone surrogate escape anywhere, invalid UTF-8, surrogates encoded as UTF-8 (CESU).
    ("surrogate in content", CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400,
     "messages[0].content"),
    ("low surrogate alone", CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages[0].content"),
    ("reversed surrogate pair", CHAT, b'{"messages": [{"role": "user", "content": "\\ude00\\ud83d"}]}', 400,
     "messages[0].content"),
    ("surrogate in a name", CHAT, b'{"messages": [{"role": "user", "content": "Hi", "name": "\\ud800"}]}', 400,
     "messages[0].name"),
    ("surrogate in model", CHAT, chat_raw('"model": "\\ud800"'), 400, "model"),
    ("surrogate in a key", CHAT, chat_raw('"logit_bias": {"\\ud800": 1}'), 400, "logit_bias"),
    ("surrogate in a stop string", COMPLETIONS, b'{"prompt": "Hi", "stop": ["ok", "\\udbff"]}', 400, "stop[1]"),
    ("surrogate in a completion prompt", COMPLETIONS, b'{"prompt": ["Hi", "\\ud800"]}', 400, "prompt[1]"),
    ("surrogate on /tokenize", "/tokenize", b'{"prompt": "\\ud800"}', 400, "prompt"),
    ("surrogate in model on /detokenize", "/detokenize", b'{"tokens": [1], "model": "\\ud800"}', 400, "model"),
    ("invalid UTF-8", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
    ("UTF-8-encoded surrogate", CHAT, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', 400, None),
    ("truncated UTF-8", "/tokenize", b'{"prompt": "\xe4\xbd"}', 400, None),
    # Wrong JSON types are refused, not coerced.
    ("stream as a string", CHAT, chat_raw('"stream": "yes"'), 400, "stream"),
    ("stream as 1", CHAT, chat_raw('"stream": 1'), 400, "stream"),
    ("logprobs as a string", CHAT, chat_raw('"logprobs": "true"'), 400, "logprobs"),
    ("ignore_eos as 0", CHAT, chat_raw('"ignore_eos": 0'), 400, "ignore_eos"),
    ("include_usage as a string", CHAT, chat_raw('"stream": true, "stream_options": {"include_usage": "no"}'), 400,
     "stream_options.include_usage"),
    ("max_tokens as a string", CHAT, chat_raw('"max_completion_tokens": "4"'), 400, "max_completion_tokens"),
    ("max_tokens as 4.0", COMPLETIONS, b'{"prompt": "Hi", "max_tokens": 4.0}', 400, "max_tokens"),
    ("n as true", CHAT, chat_raw('"n": true'), 400, "n"),
    ("seed as a string", CHAT, chat_raw('"seed": "7"'), 400, "seed"),
    ("temperature as a string", CHAT, chat_raw('"temperature": "0.5"'), 400, "temperature"),
    ("temperature as true", CHAT, chat_raw('"temperature": true'), 400, "temperature"),
    ("logit_bias value as a string", CHAT, chat_raw('"logit_bias": {"5": "1"}'), 400, "logit_bias.5"),
    ("stop_token_ids with false", CHAT, chat_raw('"stop_token_ids": [false]'), 400, "stop_token_ids[0]"),
    ("content as a number", CHAT, b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
    ("prompt ids with true", COMPLETIONS, b'{"prompt": [1, true]}', 400, "prompt"),
    ("detokenize: false as a token", "/detokenize", b'{"tokens": [false]}', 400, "tokens[0]"),
    ("detokenize: a string as a token", "/detokenize", b'{"tokens": ["1"]}', 400, "tokens[0]"),
    ("detokenize: a float as a token", "/detokenize", b'{"tokens": [1.0]}', 400, "tokens[0]"),
    ("tokenize: add_special_tokens as a string", "/tokenize", b'{"prompt": "Hi", "add_special_tokens": "false"}',
     400, "add_special_tokens"),
    ("tokenize: return_token_strs as 1", "/tokenize", b'{"prompt": "Hi", "return_token_strs": 1}', 400,
     "return_token_strs"),
    ("tokenize: add_generation_prompt as null", "/tokenize",
     b'{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": null}', 400,
     "add_generation_prompt"),
    # Duplicate keys: refused, never "the last one wins".
    ("duplicate top-level key", CHAT, chat_raw('"max_tokens": 8'), 400, "max_tokens"),
    ("duplicate nested key", CHAT, b'{"messages": [{"role": "user", "role": "system", "content": "Hi"}]}', 400,
     "messages[0].role"),
    ("duplicate key on /detokenize", "/detokenize", b'{"tokens": [1], "tokens": [2]}', 400, "tokens"),
    # Size and shape caps.
    ("nested 33 deep", CHAT, nested(32), 400, "x" + "[0]" * 31),
    ("nested 100000 deep", CHAT, nested(100_000), 400, None),
    ("array of 300000 token ids", COMPLETIONS, json.dumps({"prompt": [1] * 300_000}).encode(), 413, "prompt"),
    ("array of 300000 stop strings", COMPLETIONS, json.dumps({"prompt": "Hi", "stop": ["x"] * 300_000}).encode(),
     413, "stop"),
    ("a number of 5000 digits", CHAT, chat_raw('"seed": ' + "9" * 5000), 400, None),
]


def check_error_body(response: httpx.Response, status: int, param: str | None) -> None:
    """The OpenAI error body, the status as its code, and the param (named in the message too)."""
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] == status and error["message"], error
    assert error["param"] == param, error
    if param is not None:
        assert param.split("[")[0].split(".")[0] in error["message"], error


def normal_request_still_served(server) -> None:
    """A tokenizer round trip and /health answer at once (no generation: this module's engine
    must see no request)."""
    response = httpx.post(f"{server.url}/tokenize", json={"prompt": "still here"}, timeout=10)
    assert response.status_code == 200 and response.json()["count"] >= 2
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
