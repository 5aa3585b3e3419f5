"""The LoRA delta on the CPU's native kernels (engine/native/csrc/lora_delta.cpp), on every tier
this machine runs, and inside the one-call decode layers.

The kernel against float64 shrink-then-expand (float32 within 1e-5 relative to the largest delta,
bfloat16 within a rounding of the output and of t); base rows left bitwise as they are; a row's result the
same bits alone as in any batch. The default model on its codes with adapters: decode steps with
adapter rows run in the one native call and give bitwise the modules' logprobs (which add the same
kernel's delta), and each request its own tokens.
"""
from __future__ import annotations

import pytest
import torch
from lora_adapters import make_adapter

from common.default_model import ensure_default_model
from common.messages import LoraRequest, SamplingParams
from engine.llm import LLM
from engine.models.group_quantized import GroupQuantizedMethod
from engine.models.native_decode import NativeDecodeLayers
from engine.native import kernels

SLOTS = [-1, 0, 2, 1, -1, 2, 2, 0, 1, 2, 2, 2, 0]  # mixed, and runs longer than one block of rows


def _case(dtype, k, n, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    slots = torch.tensor(SLOTS, dtype=torch.int32)
    x = torch.randn(len(SLOTS), k, generator=g).to(dtype)
    a = (torch.randn(3, width, k, generator=g) / k ** 0.5).to(dtype)
    bt = torch.randn(3, width, n, generator=g).to(dtype)
    base = torch.randn(len(SLOTS), n, generator=g).to(dtype)
    return x, a, bt, base, slots


def _float64(x, a, bt, base, slots):
    out = base.double().clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            out[i] += (x[i].double() @ a[s].double().t()) @ bt[s].double()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# aligned, ragged, an odd rank width
@pytest.mark.parametrize("k,n,width", [(576, 960, 48), (100, 70, 24), (1536, 576, 16), (100, 70, 15)])
def test_delta_matches_float64(native_tier, dtype, k, n, width):
    x, a, bt, base, slots = _case(dtype, k, n, width)
    out = base.clone()
    native_tier.lora_add_delta(x, out, a, bt, slots)
    assert torch.equal(out[slots < 0], base[slots < 0])  # base rows untouched
    ref = _float64(x, a, bt, base, slots)
    err = (out.double() - ref).abs()
    delta = (ref - base.double()).abs().max().item()
    if dtype == torch.float32:  # float32 sums of up to 1536 products
        assert err.max().item() < 1e-5 * delta
    else:  # one rounding of the output to bfloat16, and of t where the tier pairs bfloat16 products
        assert (err <= ref.abs() * 2**-8 + delta * 2**-8).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_delta_does_not_depend_on_the_batch(native_tier, dtype):
    x, a, bt, base, slots = _case(dtype, 576, 960, 48, seed=1)
    batch = base.clone()
    native_tier.lora_add_delta(x, batch, a, bt, slots)
    for i in range(len(SLOTS)):
        alone = base[i:i + 1].clone()
        native_tier.lora_add_delta(x[i:i + 1], alone, a, bt, slots[i:i + 1])
        assert torch.equal(alone[0], batch[i]), f"row {i}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slices_read_only_their_blocks_of_b(native_tier, dtype):
    """A merged projection's B^T is block-diagonal (q, k, v): with its slices the kernel reads only
    their blocks (NaN elsewhere changes nothing) and equals float64 over the zeros."""
    x, a, bt, base, slots = _case(dtype, 100, 70, 24, seed=2)
    slices = [(0, 8, 0, 40), (8, 16, 40, 57), (16, 24, 57, 70)]  # ragged column ranges
    inside = torch.zeros(24, 70, dtype=torch.bool)
    for r0, r1, c0, c1 in slices:
        inside[r0:r1, c0:c1] = True
    ref = _float64(x, a, bt * inside, base, slots)
    out = base.clone()
    native_tier.lora_add_delta(x, out, a, bt.masked_fill(~inside, float("nan")), slots,
                               [v for s in slices for v in s])
    err = (out.double() - ref).abs()
    delta = (ref - base.double()).abs().max().item()
    assert (err <= ref.abs() * 2**-8 + delta * (2**-8 if dtype == torch.bfloat16 else 1e-5)).all()
    with pytest.raises(RuntimeError, match="slice 0 outside"):
        native_tier.lora_add_delta(x, base.clone(), a, bt, slots, [0, 25, 0, 70])


def test_bad_slots_are_refused(native_tier):
    x, a, bt, base, _ = _case(torch.float32, 64, 32, 8)
    with pytest.raises(RuntimeError, match="slot 3 of row 0"):
        native_tier.lora_add_delta(x[:1], base[:1], a, bt, torch.tensor([3], dtype=torch.int32))


class CountedCalls:
    """The native DecodeLayers object, counting the steps it takes with adapter rows."""

    def __init__(self, impl):
        self.impl, self.lora_calls = impl, 0

    def forward(self, *args):
        self.lora_calls += args[-1] is not None
        return self.impl.forward(*args)

    def set_lora(self, *args):
        return self.impl.set_lora(*args)


@pytest.mark.skipif(kernels() is None, reason="the native CPU kernels could not be built here")
def test_decode_steps_with_adapters_run_in_the_one_call(tmp_path):
    model_dir = ensure_default_model()
    loras = [LoraRequest(f"a{i}", i + 1, str(make_adapter(model_dir, tmp_path / f"a{i}", seed=20 + i, r=8)))
             for i in range(2)]
    llm = LLM(dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20, max_model_len=256, max_num_seqs=8,
              enable_prefix_caching=False, enable_lora=True, max_loras=2)
    model = llm.engine.model
    assert model.native_layers is not None and model.native_layers.has_lora
    # every layer on its codes up to 4 rows, whatever crossover this machine timed at start-up (a
    # busy machine can time it under 3 rows, and steps above it leave the call unless every batch
    # method is a native kernel)
    for module in model.modules():
        if isinstance(getattr(module, "method", None), GroupQuantizedMethod):
            module.method.max_rows = 4
    layers = NativeDecodeLayers(model, kernels(), model.native_layers.kv_caches)
    layers.attach_lora(model)
    layers.impl = CountedCalls(layers.impl)
    prompts = [[300 + 13 * i + 7 * j for j in range(24)] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=10, min_tokens=10, logprobs=2)

    def run(native: bool):
        model.native_layers = layers if native else None
        try:
            outputs = llm.generate(prompts, params, lora_request=[None, *loras])
        finally:
            model.native_layers = layers
        return [(o.outputs[0].token_ids, [[(t.token_id, t.logprob) for t in step] for step in o.outputs[0].logprobs])
                for o in outputs]

    one_call = run(native=True)
    assert layers.impl.lora_calls >= 9, f"the one call took {layers.impl.lora_calls} of the 9 decode steps"
    assert one_call == run(native=False)
    assert len({tuple(tokens) for tokens, _ in one_call}) >= 2  # the adapters change the text
