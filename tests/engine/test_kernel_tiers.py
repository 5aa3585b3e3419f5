"""The native kernels' ISA tiers (engine/native/tiers.py): built, chosen, forced, and the engine on
each of them.

- Every tier this CPU runs is built from the sources as they are now (a tier that should have been
  built and was not fails here, never skips).
- The choice: the best tier the CPU runs; LLM_CPU_KERNEL_TIER forces a lower one, and a tier that
  is unknown or that the CPU lacks is refused with the choices named.
- The platform logs the tier and picks the dtype from it (bfloat16 only with bf16 arithmetic).
- The sources compile for aarch64 (Debian's cross compiler, syntax only, torch's headers).
- The engine on every tier the CPU runs, --dtype auto: greedy tokens of the real model equal the
  exact float32 model's (transformers), or part from it only at a near-tie (the tiers add in
  different orders, and bfloat16 activations round). The prompts' prefill takes the dense batch
  method, as in test_default_format.py: the int8 batches (lossy, held to their perplexity there and
  to a reference kernel by kernel) part from the exact model at gaps up to ~0.35.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from native_tiers import BUILDABLE_TIERS, tier_module
from real_prompts import QUESTIONS

from common.messages import SamplingParams
from engine import native as native_package
from engine.native import load_tier, tiers
from engine.platform import Platform

NEAR_TIE = 0.15  # float32 logit gap below which two candidates are a tie (test_default_format.py)


def test_every_tier_this_cpu_runs_is_built_from_these_sources():
    for tier in tiers.runnable():
        module = load_tier(tier)
        assert module.tier == tier.name
        assert module.sources_hash == tiers.sources_hash(), f"{tier.name}: stale, `make native` rebuilds it"


def test_the_best_tier_is_chosen_and_a_lower_one_can_be_forced(monkeypatch):
    zen3 = {"avx", "avx2", "fma", "f16c", "bmi2"}
    zen4 = zen3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}
    sapphire_rapids = zen4 | {"amx_tile", "amx_bf16", "amx_int8"}
    monkeypatch.delenv(tiers.FORCE_ENV, raising=False)
    assert tiers.choose(zen3).name == "avx2"
    assert tiers.choose(zen4).name == "avx512_bf16"
    assert tiers.choose(sapphire_rapids).name == "avx512_amx"
    assert tiers.choose(set()).name == "scalar"
    assert tiers.choose(zen4, forced="avx2").name == "avx2"
    monkeypatch.setenv(tiers.FORCE_ENV, "scalar")
    assert tiers.choose(zen4).name == "scalar"
    with pytest.raises(ValueError, match="lacks avx512_bf16.*runs avx2, scalar"):
        tiers.choose(zen3, forced="avx512_bf16")
    with pytest.raises(ValueError, match="unknown tier; choose one of avx512_amx"):
        tiers.choose(zen3, forced="sse2")


@pytest.mark.parametrize("name", BUILDABLE_TIERS)
def test_the_platform_runs_the_tier_and_picks_its_dtype(name, monkeypatch):
    tier_module(name)  # skipped where this CPU cannot run it
    monkeypatch.setenv(tiers.FORCE_ENV, name)
    native_package.kernels.cache_clear()
    try:
        platform = Platform.create("cpu", "auto")
        assert platform.native is not None and platform.native.tier == name
        assert platform.dtype == (torch.bfloat16 if tiers.BY_NAME[name].bf16_compute else torch.float32)
        assert f"kernel tier {name} (CPU flags" in platform.describe(8)
        assert Platform.create("cpu", "bfloat16").dtype == torch.bfloat16  # asked for: taken as asked
    finally:
        native_package.kernels.cache_clear()


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="no aarch64 cross compiler here (Debian's g++-aarch64-linux-gnu)")
def test_the_sources_compile_for_aarch64():
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]

    def check(source: str) -> subprocess.CompletedProcess:
        return subprocess.run(["aarch64-linux-gnu-g++", "-std=c++17", "-fsyntax-only", "-fopenmp", *includes,
                               str(tiers.CSRC / source)], capture_output=True, text=True)

    with ThreadPoolExecutor(os.cpu_count()) as pool:  # one compiler per core
        for source, done in zip(tiers.SOURCES, pool.map(check, tiers.SOURCES), strict=True):
            assert done.returncode == 0, f"{source}:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def exact_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.default_model import ensure_default_model

    folder = ensure_default_model()
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILDABLE_TIERS)
def test_the_engine_on_each_tier_gives_the_exact_models_greedy_tokens(name, exact_model, monkeypatch):
    from engine.llm import LLM

    tier_module(name)
    hf, tok = exact_model
    monkeypatch.setenv(tiers.FORCE_ENV, name)
    native_package.kernels.cache_clear()
    try:
        llm = LLM(device="cpu", kv_cache_memory=64 << 20, max_model_len=512, max_num_seqs=8, batch_linear="dense")
        assert llm.engine.platform.native.tier == name
        prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in QUESTIONS[:3]]
        params = SamplingParams(temperature=0, max_tokens=16, min_tokens=16)
        ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    finally:
        native_package.kernels.cache_clear()
    for prompt, tokens in zip(prompts, ours, strict=True):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            exact = hf.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16,
                                do_sample=False)[0, len(ids):]
        if tokens == exact.tolist():
            continue
        at = next(i for i, (a, b) in enumerate(zip(tokens, exact.tolist(), strict=True)) if a != b)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + tokens[:at]])).logits[0, -1]
        gap = (logits[exact[at]] - logits[tokens[at]]).item()
        print(f"{name}: {prompt[-40:]!r} parts at token {at}, float32 logit gap {gap:.4f}")
        assert gap < NEAR_TIE, (name, prompt, at, gap)
