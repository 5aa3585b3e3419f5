"""The real server with `--kv-cache-dtype int8`: greedy answers through the OpenAI SDK equal the
offline engine's with the same cache, the streamed text equals the whole text, the start-up log
names the cache's rows and holds more tokens than the same memory in float32 would, and a value
the server does not know (vLLM's fp8) is refused before anything loads."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from openai import OpenAI

from common.messages import SamplingParams
from benchmarks.grounded import grounded_messages
from engine.llm import LLM
from server_process import REPO, start_server

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    s = start_server("--kv-cache-dtype", "int8")
    yield s
    s.stop()


def test_greedy_answers_equal_the_engine_with_the_same_cache(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    conversations = grounded_messages()[:2]
    reference = LLM(dtype="float32", device="cpu", kv_cache_memory=128 << 20, max_model_len=2048,
                    kv_cache_dtype="int8")
    prompts = [reference.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
               for c in conversations]
    want = reference.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    for conversation, expected in zip(conversations, want, strict=True):
        out = client.chat.completions.create(model=MODEL, messages=conversation, max_tokens=48, temperature=0)
        assert out.choices[0].message.content == expected.outputs[0].text
        assert out.usage.completion_tokens == len(expected.outputs[0].token_ids)
        stream = client.chat.completions.create(model=MODEL, messages=conversation, max_tokens=48, temperature=0,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == out.choices[0].message.content


def test_the_log_names_the_int8_rows_and_their_tokens(server):
    log = server.log_text()
    match = re.search(r"KV cache (\d+) blocks x (\d+) = (\d+) tokens \(int8 rows with a float32 scale each\)", log)
    assert match, log[-3000:]
    # 128 MiB of float32 rows would hold 128 MiB / (2 K/V x 30 layers x 3 heads x 64 x 4 bytes) tokens;
    # int8 rows of 68 bytes hold 256 / 68 times as many (unless max_model_len x max_num_seqs caps it)
    float32_tokens = (128 << 20) // (2 * 30 * 3 * 64 * 4)
    assert int(match.group(3)) >= 3 * float32_tokens


def test_an_unknown_kv_cache_dtype_is_refused():
    result = subprocess.run([sys.executable, "-m", "server", "--kv-cache-dtype", "fp8"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--kv-cache-dtype" in result.stderr and "invalid choice" in result.stderr, result.stderr
