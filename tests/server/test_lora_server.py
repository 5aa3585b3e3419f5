"""LoRA adapters through the real server: chosen by `model`, listed in /v1/models, loaded and
unloaded at run time under traffic, against transformers + peft's generate (float32, greedy)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from lora_adapters import make_adapter, peft_model
from server_process import ServerProcess
from transformers import AutoTokenizer

from common.default_model import DEFAULT_MODEL_NAME, ensure_default_model

pytestmark = pytest.mark.slow  # a real server, peft references

PROMPT = "Once upon a time, in a small village,"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    model_dir = ensure_default_model()
    root = tmp_path_factory.mktemp("server-loras")
    return {name: make_adapter(model_dir, root / name, seed=seed, r=8, alpha=16, b_scale=0.5)
            for name, seed in (("a", 11), ("b", 12), ("c", 13))}


@pytest.fixture(scope="module")
def server(adapters):
    b_module = json.dumps({"name": "b", "path": str(adapters["b"]), "base_model_name": DEFAULT_MODEL_NAME})
    proc = ServerProcess("--enable-lora", "--max-loras", "2", "--lora-modules", f"a={adapters['a']}", b_module,
                         "--allow-runtime-lora-updating").wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def prompt_ids():
    return AutoTokenizer.from_pretrained(str(ensure_default_model())).encode(PROMPT, add_special_tokens=False)


def peft_text(adapter_dir, prompt_ids) -> str:
    model_dir = ensure_default_model()
    ref = peft_model(model_dir, adapter_dir)
    ids = torch.tensor([prompt_ids])
    out = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                       min_new_tokens=MAX_TOKENS, do_sample=False)[0, ids.shape[1]:].tolist()
    return AutoTokenizer.from_pretrained(str(model_dir)).decode(out)


def complete(client: httpx.Client, model: str, prompt_ids: list[int]) -> httpx.Response:
    return client.post("/v1/completions", json={"model": model, "prompt": prompt_ids, "max_tokens": MAX_TOKENS,
                                                "temperature": 0, "ignore_eos": True})


def test_models_list_adapters_and_texts_equal_peft(server, adapters, prompt_ids):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert models["a"]["parent"] == DEFAULT_MODEL_NAME and models["b"]["parent"] == DEFAULT_MODEL_NAME
        assert models[DEFAULT_MODEL_NAME]["parent"] is None
        base = complete(client, DEFAULT_MODEL_NAME, prompt_ids).json()["choices"][0]["text"]
        for name in ("a", "b"):
            r = complete(client, name, prompt_ids)
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["text"]
            assert text == peft_text(adapters[name], prompt_ids), name
            assert text != base
        chat = client.post("/v1/chat/completions", json={"model": "a", "max_tokens": 4, "temperature": 0,
                                                          "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200, chat.text
        unknown = complete(client, "nope", prompt_ids)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        metrics = client.get("/metrics").text
        assert 'vllm:lora_requests_info{max_lora="2"' in metrics


def test_load_use_unload_load_again_under_traffic(server, adapters, prompt_ids):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        expected = {m: complete(client, m, prompt_ids).json()["choices"][0]["text"]
                    for m in (DEFAULT_MODEL_NAME, "a", "b")}
        bad = client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"})
        assert bad.status_code == 400 and "no such folder" in bad.json()["error"]["message"]
        dup = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(adapters["c"])})
        assert dup.status_code == 400 and "already been loaded" in dup.json()["error"]["message"]
        missing = client.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
        assert missing.status_code == 404
    c_text = peft_text(adapters["c"], prompt_ids)

    async def traffic() -> list[tuple[str, httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            async def one(model: str):
                return model, await client.post("/v1/completions", json={
                    "model": model, "prompt": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True})

            async def churn():
                seen = []
                for _ in range(3):
                    load = await client.post("/v1/load_lora_adapter",
                                             json={"lora_name": "c", "lora_path": str(adapters["c"])})
                    assert load.status_code == 200, load.text
                    seen.append(await one("c"))
                    unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
                    assert unload.status_code == 200, unload.text
                    gone = await one("c")
                    assert gone[1].status_code == 404
                return seen

            models = [DEFAULT_MODEL_NAME, "a", "b"] * 6
            results = await asyncio.gather(churn(), *(one(m) for m in models))
            return results[0] + list(results[1:])

    results = asyncio.run(traffic())
    for model, response in results:
        assert response.status_code == 200, (model, response.text)
        text = response.json()["choices"][0]["text"]
        assert text == (c_text if model == "c" else expected[model]), model
    assert sum(m == "c" for m, _ in results) == 3


def test_runtime_updates_are_off_by_default(adapters):
    proc = ServerProcess("--enable-lora", "--lora-modules", f"a={adapters['a']}").wait_ready()
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as client:
            r = client.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(adapters["c"])})
            assert r.status_code == 404
            assert client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 404
            assert "a" in {m["id"] for m in client.get("/v1/models").json()["data"]}
    finally:
        proc.stop()
