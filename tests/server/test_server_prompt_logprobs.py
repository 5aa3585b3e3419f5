"""Echo and prompt logprobs on the real server (float32, dense weights, prefill in chunks of 32
tokens) against transformers, and lm-eval's `local-completions` on a small multiple-choice task
against lm-eval's own transformers backend."""
from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.default_model import DEFAULT_MODEL_NAME, default_model_dir
from server_process import start_server, stream_post

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

TOLERANCE = 1e-3  # float32 against float32: the sums' order differs, nothing else
TASK_DIR = Path(__file__).parent / "lm_eval_task"


@pytest.fixture(scope="module")
def server():
    # Chunks of 32 tokens: every longer prompt's logprobs are gathered from several steps.
    s = start_server("--quantization", "none", "--max-num-batched-tokens", "32")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hf():
    model_dir = str(default_model_dir())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def reference_logprobs(hf, ids: list[int]) -> list[float]:
    """transformers' logprob of each prompt token after the first."""
    model, _ = hf
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def completions(server, **body) -> dict:
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_lm_eval_payload_matches_transformers(server, hf):
    """lm-eval's exact loglikelihood request: a batch of token-id prompts, echo, logprobs 1, max_tokens 1."""
    _, tok = hf
    texts = ["Question: What is the capital of France?\nAnswer: Paris",
             "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest "
             "where nobody can see it any more, not even the owl that watches from the old oak tree.",
             "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24"]
    prompts = [tok.encode(t) for t in texts]
    assert max(len(p) for p in prompts) > 64  # three chunks at least
    payload = {"model": DEFAULT_MODEL_NAME, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
               "seed": 1234, "echo": True}
    first = completions(server, **payload)
    worst = 0.0
    for choice, ids in zip(sorted(first["choices"], key=lambda c: c["index"]), prompts, strict=True):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + 1  # the prompt, then the one generated token
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(len(top) <= 2 for top in lp["top_logprobs"][1:])
        assert lp["text_offset"] == sorted(lp["text_offset"])
        ours = lp["token_logprobs"][1:len(ids)]
        worst = max(worst, max(abs(a - b) for a, b in zip(ours, reference_logprobs(hf, ids), strict=True)))
        # lm-eval's greedy check reads the top entry of each position
        assert all(max(top.values()) >= value - 1e-6 for top, value in zip(lp["top_logprobs"][1:len(ids)], ours,
                                                                            strict=True))
    print(f"max |ours - transformers| over {sum(len(p) - 1 for p in prompts)} prompt tokens: {worst:.2e}")
    assert worst < TOLERANCE
    # The same prompts again, now in the prefix cache: computed again, the same figures.
    again = completions(server, **payload)
    for a, b in zip(first["choices"], again["choices"], strict=True):
        assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=1e-5)
    # A request that does not ask still finds the cache.
    plain = completions(server, model=DEFAULT_MODEL_NAME, prompt=prompts[1], max_tokens=1, temperature=0)
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32


def test_echo_text_and_max_tokens_zero(server):
    prompt = "The capital of France is"
    plain = completions(server, prompt=prompt, max_tokens=6, temperature=0)
    echoed = completions(server, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert echoed["choices"][0]["text"] == prompt + plain["choices"][0]["text"]
    assert echoed["choices"][0]["logprobs"] is None
    alone = completions(server, prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    choice = alone["choices"][0]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    assert alone["usage"]["completion_tokens"] == 0 and alone["usage"]["prompt_tokens"] == len(
        choice["logprobs"]["tokens"])
    assert "".join(choice["logprobs"]["tokens"]) == prompt
    assert all(len(top) <= 3 for top in choice["logprobs"]["top_logprobs"][1:])


def test_echo_streamed_equals_non_streamed(server):
    body = {"prompt": ["Once upon a time", "Water boils at"], "max_tokens": 5, "temperature": 0, "echo": True,
            "logprobs": 1}
    whole = completions(server, **body)
    chunks = stream_post(f"{server.url}/v1/completions", {**body, "stream": True})
    texts: dict[int, str] = {}
    logprobs: dict[int, list] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c["logprobs"]:
                logprobs.setdefault(c["index"], []).extend(c["logprobs"]["token_logprobs"])
    for choice in whole["choices"]:
        assert texts[choice["index"]] == choice["text"]
        assert logprobs[choice["index"]] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-6)
        assert choice["text"].startswith(body["prompt"][choice["index"]])


def test_prompt_logprobs_in_vllms_shape_on_both_endpoints(server, hf):
    messages = [{"role": "user", "content": "Name three fruits."}]
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=300, json={
        "messages": messages, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}).json()
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=60).json()["tokens"]
    entries = chat["prompt_logprobs"]
    assert len(entries) == len(ids) == chat["usage"]["prompt_tokens"] and entries[0] is None
    for token, entry in zip(ids[1:], entries[1:], strict=True):
        assert str(token) in entry and 1 <= len(entry) <= 3
        assert entry[str(token)]["rank"] >= 1 and isinstance(entry[str(token)]["decoded_token"], str)
        ranks = sorted(e["rank"] for key, e in entry.items() if key != str(token))
        assert ranks == list(range(1, len(ranks) + 1)) or entry[str(token)]["rank"] <= 2
    ours = [entry[str(t)]["logprob"] for t, entry in zip(ids[1:], entries[1:], strict=True)]
    assert max(abs(a - b) for a, b in zip(ours, reference_logprobs(hf, ids), strict=True)) < TOLERANCE
    completion = completions(server, prompt=ids, max_tokens=1, temperature=0, prompt_logprobs=0)
    same = completion["choices"][0]["prompt_logprobs"]
    assert same[0] is None and all(len(e) == 1 for e in same[1:])
    assert [e[str(t)]["logprob"] for t, e in zip(ids[1:], same[1:], strict=True)] == pytest.approx(ours, abs=1e-4)


def test_openai_sdk_echo(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)
    out = client.completions.create(model=DEFAULT_MODEL_NAME, prompt="Hello there", echo=True, logprobs=1,
                                    max_tokens=0)
    choice = out.choices[0]
    assert choice.text == "Hello there" and choice.logprobs.token_logprobs[0] is None
    assert all(math.isfinite(v) and v <= 0 for v in choice.logprobs.token_logprobs[1:])


def test_lm_eval_local_completions_scores_as_transformers(server, tmp_path, monkeypatch):
    """lm-eval itself: the task through our server (local-completions, batches of 4 token-id prompts)
    and through lm-eval's transformers backend give the same accuracy and loglikelihoods."""
    for offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # the task and the model are local files
        monkeypatch.setenv(offline, "1")
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    task = yaml.safe_load((TASK_DIR / "tiny_mc.yaml").read_text())
    task["dataset_kwargs"]["data_files"]["test"] = str(TASK_DIR / "tiny_mc.jsonl")
    (tmp_path / "tiny_mc.yaml").write_text(yaml.safe_dump(task))
    model_dir = str(default_model_dir())

    def evaluate(model: str, model_args: dict) -> tuple[float, list[list[float]]]:
        out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["tiny_mc"], log_samples=True,
                                      task_manager=TaskManager(include_path=str(tmp_path)))
        samples = sorted(out["samples"]["tiny_mc"], key=lambda s: s["doc_id"])
        return out["results"]["tiny_mc"]["acc,none"], [[r[0] for r in s["filtered_resps"]] for s in samples]

    served_acc, served = evaluate("local-completions", {
        "base_url": f"{server.url}/v1/completions", "model": DEFAULT_MODEL_NAME, "tokenizer": model_dir,
        "tokenizer_backend": "huggingface", "batch_size": 4, "max_retries": 1})
    offline_acc, offline = evaluate("hf", {"pretrained": model_dir, "dtype": "float32", "device": "cpu",
                                           "batch_size": 4})
    worst = max(abs(a - b) for doc_a, doc_b in zip(served, offline, strict=True)
                for a, b in zip(doc_a, doc_b, strict=True))
    print(f"tiny_mc accuracy: served {served_acc}, transformers {offline_acc}; max |loglikelihood diff| {worst:.2e}")
    assert served_acc == offline_acc
    assert worst < TOLERANCE * 8  # a sum of up to a few tokens' logprobs
