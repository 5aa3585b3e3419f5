"""Schemathesis against our own /openapi.json, on every operation, with positive data (valid by
the schema) and negative data (wrong types, missing or unknown fields, ...):
- no request gets a 5xx;
- every request that violates the schema is refused with a 4xx (negative_data_rejection);
- status codes, content types and bodies are the documented ones;
- afterwards the server is healthy, serves a normal request, and the engine is idle.

The HTTP layer is under test here, not the model: the server runs a tiny random-weight Llama
with the default model's tokenizer and chat template, so the generations that positive data
starts (up to max_model_len tokens, up to 16 sequences) cost milliseconds per token, and the
example count (MAX_EXAMPLES per operation and phase, about 1000 requests in all) keeps the test
within about half a minute.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server_process import start_server

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

MAX_EXAMPLES = 50
SEED = 12  # fixed, so the suite is reproducible; another seed explores other inputs
FUZZ_TIMEOUT_S = 300
EXCLUDED_CHECKS = (
    # Valid by the schema is not always valid: the ranges (temperature in [0, 2], a prompt within
    # max_model_len, ...) are the engine's checks (common.validation) and answer 400.
    "positive_data_acceptance",
    # Checks for APIs with resources and authentication, which this one has not.
    "use_after_free", "ensure_resource_availability", "ignored_auth", "object_level_authorization",
)
# The default warnings but missing test data: GET /v1/responses/{id} knows only the ids its POST
# made, and /v1/messages requires a model (Anthropic's API does) that random names never are, so
# the 404s the fuzzer's values get are the documented answers, not a gap in its inputs.
WARNINGS = ("missing_auth", "base_url_mismatch", "validation_mismatch", "missing_deserializer",
            "unused_openapi_auth", "unsupported_regex", "method_not_allowed", "constants_extraction",
            "unmatched_filter", "unresolvable_reference", "rate_limited", "dictionary_mismatch", "timeout_units")
MAX_MODEL_LEN = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def tiny_chat_model(path) -> str:
    """A 2-layer, 64-wide Llama with the default model's vocabulary and tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from common.default_model import ensure_default_model

    source = ensure_default_model()
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_MODEL_LEN,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, path / name)
    return str(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model"))
    # At most 16 sequences at once: a larger n is refused with a 400 at once instead of running
    # 128 sampled rows over the 49152-token vocabulary for every step.
    # One torch thread: on a machine whose cores are busy, two threads wait for each other at
    # every op and a step takes many times longer; the speed of the model is not under test.
    s = start_server(model_dir, "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", "tiny",
                     "--max-num-seqs", "8", "--max-queued-requests", "8", env={"OMP_NUM_THREADS": "1"})
    yield s
    s.stop()


@pytest.mark.timeout(FUZZ_TIMEOUT_S + 300)  # the fuzzer's own limit, and the server's start
def test_fuzz_every_operation(server, tmp_path):
    """`schemathesis run` (its own runner: the examples, coverage and fuzzing phases) on every
    operation of the document; it exits non-zero on the first kind of failure of any check."""
    command = [str(Path(sys.executable).parent / "schemathesis"), "run", f"{server.url}/openapi.json",
               "--mode", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
               "--phases", "examples,coverage,fuzzing", "--workers", "1", "--request-timeout", "60",
               "--max-response-time", "60",
               "--checks", "all", "--exclude-checks", ",".join(EXCLUDED_CHECKS),
               "--warnings", ",".join(WARNINGS),
               "--generation-database", "none", "--no-color", "--report-dir", str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=FUZZ_TIMEOUT_S, cwd=tmp_path)
    assert run.returncode == 0, f"schemathesis found failures:\n{run.stdout[-12000:]}\n{run.stderr[-2000:]}"
    paths = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
    num_operations = sum(len(methods) for methods in paths.values())
    assert f"Tested: {num_operations}" in run.stdout and "No issues found" in run.stdout, run.stdout[-4000:]


def test_server_healthy_after_fuzzing(server):
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    ok = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                    json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'vllm:num_requests_running{model_name="tiny"} 0.0' in metrics
    assert 'vllm:kv_cache_usage_perc{model_name="tiny"} 0.0' in metrics
