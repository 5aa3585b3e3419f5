"""All decoder layers in one native call (engine/models/native_decode.py) against the modules.

The default model on its codes, greedy with logprobs: decode steps taken by the one native call
give bitwise the modules' logprobs (the same kernels in the same order), counted so the test
knows the call ran; steps it must not take (prefill chunks, more rows than every layer's codes
crossover unless every batch method is the int8 kernel, a batch-invariant request) leave it
alone and still give the same tokens. With the default linears, with `--batch-linear int8` (Q4_1
codes against int8 activations), with `--batch-linear amx` (the codes as bf16 tiles for batches),
and with the default linears over `--kv-cache-dtype int8`.
"""
from __future__ import annotations

import pytest
import torch

from common.messages import SamplingParams
from engine.llm import LLM
from engine.models.amx_linear import AmxCodesMethod
from engine.models.group_quantized import GroupQuantizedMethod
from engine.models.int8_linear import Int8LinearMethod
from engine.models.q4_int8_batch import Q4Int8BatchMethod
from engine.models.native_decode import NativeDecodeLayers
from engine.native import kernels

pytestmark = pytest.mark.skipif(kernels() is None, reason="the native CPU kernels could not be built here")

MAX_ROWS = 4  # every layer on its codes up to 4 rows here, whatever this machine's crossover


class CountedCalls:
    """The native DecodeLayers object, counting its steps."""

    def __init__(self, impl):
        self.impl, self.calls = impl, 0

    def forward(self, *args):
        self.calls += 1
        return self.impl.forward(*args)


@pytest.fixture(scope="module", params=["auto", "int8", "amx", "kv-int8"])
def llm(request):
    # "int8": the Q4_1 codes against int8 activations (q4_int8_linear.cpp), through the same call;
    # "kv-int8": the default linears, the KV cache as int8 rows (engine/attention/kv_int8.py)
    if request.param == "int8" and not kernels().int8_linear_available():
        pytest.skip("the int8 kernels need AVX512-VNNI")
    if request.param == "amx" and not kernels().amx_linear_available():
        pytest.skip("the AMX kernel needs AMX-BF16")
    batch_linear = request.param if request.param in ("int8", "amx") else "auto"
    # no prefix caching: the second run of a prompt computes its prefill as the first did
    llm = LLM(dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20, max_model_len=512, max_num_seqs=8,
              enable_prefix_caching=False, batch_linear=batch_linear,
              kv_cache_dtype="int8" if request.param == "kv-int8" else "auto")
    model = llm.engine.model
    assert model.native_layers is not None, "the default model's layers should run as one native call"
    assert all(k.dtype == (torch.int8 if request.param == "kv-int8" else torch.bfloat16)
               for k, _ in model.native_layers.kv_caches)
    methods = [m.method for m in model.modules() if isinstance(getattr(m, "method", None), GroupQuantizedMethod)]
    q4 = [m for m in methods if m.format == "q4_1"]
    assert q4 and all((m.int8_codes is not None) == (batch_linear == "int8") for m in q4)
    assert all(isinstance(m.batch, AmxCodesMethod) == (batch_linear == "amx") or batch_linear == "auto"
               for m in methods)
    for module in model.modules():
        if isinstance(getattr(module, "method", None), GroupQuantizedMethod):
            module.method.max_rows = MAX_ROWS
    model.native_layers = NativeDecodeLayers(model, kernels(), model.native_layers.kv_caches)  # with MAX_ROWS
    model.native_layers.impl = CountedCalls(model.native_layers.impl)
    return llm


def _run(llm: LLM, prompts: list[list[int]], native: bool, **params) -> tuple[list, int]:
    model = llm.engine.model
    layers = model.native_layers
    counter = layers.impl
    before = counter.calls
    model.native_layers = layers if native else None
    try:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, min_tokens=12, logprobs=2,
                                                       **params))
    finally:
        model.native_layers = layers
    got = [(o.outputs[0].token_ids, [[(t.token_id, t.logprob) for t in step] for step in o.outputs[0].logprobs])
           for o in outputs]
    return got, counter.calls - before


def _prompts(n: int) -> list[list[int]]:
    return [[200 + 37 * i + 11 * j for j in range(20 + 5 * i)] for i in range(n)]


@pytest.mark.parametrize("rows", [1, 3])
def test_decode_steps_in_one_call_give_the_modules_logprobs_bitwise(llm, rows):
    native, calls = _run(llm, _prompts(rows), native=True)
    modules, _ = _run(llm, _prompts(rows), native=False)
    assert calls >= 11, f"the one native call took {calls} of the 11 decode steps"
    assert native == modules


def test_steps_above_the_crossover(llm):
    # in the one call where every layer's batch method is a native kernel, int8, Q4_1 x int8 or
    # AMX (bitwise the modules'), else through the modules
    methods = [m.method for m in llm.engine.model.modules() if isinstance(getattr(m, "method", None),
                                                                          GroupQuantizedMethod)]
    in_the_call = all(isinstance(m.batch, (Int8LinearMethod, Q4Int8BatchMethod, AmxCodesMethod)) for m in methods)
    native, calls = _run(llm, _prompts(MAX_ROWS + 2), native=True)
    modules, _ = _run(llm, _prompts(MAX_ROWS + 2), native=False)
    if in_the_call:
        assert calls >= 11, f"the one native call took {calls} of the 11 decode steps"
        assert native == modules
    else:
        assert calls == 0
        assert [tokens for tokens, _ in native] == [tokens for tokens, _ in modules]


def test_batch_invariant_requests_run_the_modules(llm):
    _, calls = _run(llm, _prompts(2), native=True, batch_invariant=True)
    assert calls == 0
