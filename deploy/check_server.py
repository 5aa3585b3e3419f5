"""Check a running server the way a user would: /health, /v1/models, one streamed chat completion
through the OpenAI SDK, and the Prometheus /metrics that a scraper reads.

    python deploy/check_server.py http://127.0.0.1:8000

Exits non-zero with a message on the first check that fails.
"""
from __future__ import annotations

import sys

import httpx
from openai import OpenAI


def check(base_url: str) -> None:
    health = httpx.get(f"{base_url}/health", timeout=10)
    assert health.status_code == 200, f"/health answered {health.status_code}: {health.text}"
    print(f"GET /health -> {health.status_code}")

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    model_ids = [m.id for m in client.models.list().data]
    assert model_ids, "/v1/models lists no model"
    print(f"GET /v1/models -> {model_ids}")

    stream = client.chat.completions.create(
        model=model_ids[0], messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
    text, num_content_chunks, finish_reason, usage = "", 0, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                num_content_chunks += 1
            finish_reason = choice.finish_reason or finish_reason
    assert text.strip(), "the stream carried no text"
    assert finish_reason in ("stop", "length"), f"finish_reason {finish_reason!r}"
    assert usage is not None and usage.completion_tokens > 0, f"usage {usage!r}"
    print(f"streamed chat completion: {num_content_chunks} content chunks, finish_reason={finish_reason}, "
          f"usage={usage.prompt_tokens}+{usage.completion_tokens} tokens, text={text!r}")

    metrics = httpx.get(f"{base_url}/metrics", timeout=10)
    assert metrics.status_code == 200 and "vllm:num_requests_running" in metrics.text, "no vLLM metrics"
    print("GET /metrics -> vllm:* metrics present")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    check(sys.argv[1].rstrip("/"))
