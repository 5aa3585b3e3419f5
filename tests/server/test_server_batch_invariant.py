"""`"batch_invariant": true` through the real server and the OpenAI SDK: the same chat request gives
the same text and the same logprobs (bitwise, as floats in JSON) alone and among 15 other
requests that arrive with it, streamed or not; the field is validated like any other."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MODEL = "SmolLM2-135M-Instruct"
TOPICS = ["the sea", "a cat", "coffee", "rain", "music", "old books", "trains", "the moon", "bread", "winter",
          "chess", "gardens", "bees", "clocks", "rivers", "maps"]


def _ask(client: OpenAI, topic: str, max_tokens: int, invariant: bool, temperature: float = 0.0):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Write one sentence about {topic}."}],
        max_tokens=max_tokens, temperature=temperature, seed=5, logprobs=True, top_logprobs=5,
        extra_body={"batch_invariant": invariant})
    choice = out.choices[0]
    return choice.message.content, [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                                    for t in choice.logprobs.content]


def test_same_logprobs_alone_and_among_others(default_server):
    client = OpenAI(base_url=f"{default_server.url}/v1", api_key="none")
    tracked = [("the sea", 0.0), ("clocks", 0.8)]  # greedy, and seeded sampling
    alone = [_ask(client, topic, 16, True, temperature) for topic, temperature in tracked]
    with ThreadPoolExecutor(16) as pool:
        jobs = [pool.submit(_ask, client, topic, 16, True, temperature) for topic, temperature in tracked]
        others = [pool.submit(_ask, client, topic, 4 + i % 12, i % 3 == 0, 1.0 if i % 2 else 0.0)
                  for i, topic in enumerate(TOPICS[2:])]
        together = [job.result() for job in jobs]
        for job in others:
            job.result()
    assert together == alone


def test_streamed_text_equals_the_whole(default_server):
    client = OpenAI(base_url=f"{default_server.url}/v1", api_key="none")
    messages = [{"role": "user", "content": "Name three rivers."}]
    ask = dict(model=MODEL, messages=messages, max_tokens=20, temperature=0, extra_body={"batch_invariant": True})
    whole = client.chat.completions.create(**ask).choices[0].message.content
    stream = client.chat.completions.create(**ask, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


def test_completions_accept_it_and_bad_values_are_400(default_server):
    url = f"{default_server.url}/v1/completions"
    ok = httpx.post(url, json={"prompt": "Once upon a time", "max_tokens": 4, "batch_invariant": True}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
    bad = httpx.post(url, json={"prompt": "Once", "max_tokens": 4, "batch_invariant": "sometimes"}, timeout=60)
    assert bad.status_code == 400 and "batch_invariant" in bad.text
