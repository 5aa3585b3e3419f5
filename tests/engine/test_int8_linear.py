"""The int8 batch linear (engine/native/csrc/int8_linear.cpp) against a plain-torch reference of
the same arithmetic, and the packing it reads.

The reference quantizes each row's groups of 64 as the kernel does (float32 amax, scale 127 /
amax, round half to even), takes the integer dots exactly in float64 and applies the scales in
float64: the kernel's float32 sums over the groups must match it to float32 rounding.
"""
from __future__ import annotations

import pytest
import torch

from engine.models.int8_linear import GROUP, pack_int8, unpack_int8


@pytest.fixture
def native(native_tier):
    if not native_tier.int8_linear_available():
        pytest.skip(f"the {native_tier.tier} tier has no int8 dot product (the scalar tier)")
    return native_tier


def _reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    rows, inputs = x.shape
    groups = x.float().view(rows, inputs // GROUP, GROUP)
    amax = groups.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    qx = torch.round(groups * inv).double()
    weights_q = torch.round(unpack_int8(codes, torch.ones_like(scales))).double()  # the integers
    dots = torch.einsum("mgk,ngk->mgn", qx, weights_q.view(-1, inputs // GROUP, GROUP))
    return ((dots * (amax / 127).double()).sum(1) * scales.double()).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 11, 32])
@pytest.mark.parametrize("inputs,outputs", [(64, 16), (192, 80), (576, 960)])  # 80: a tile of 3 vectors and one of 2
def test_int8_linear_matches_the_reference(native, dtype, rows, inputs, outputs):
    g = torch.Generator().manual_seed(rows * 1000 + outputs)
    x = torch.randn(rows, inputs, generator=g).to(dtype)
    x[0, :GROUP] = 0  # a group of zeros: scale 0, no division by it
    codes, scales = pack_int8(torch.randn(outputs, inputs, generator=g))
    expected = _reference(x, codes, scales)
    out32 = native.int8_linear(x, codes, scales, True)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    out = native.int8_linear(x, codes, scales, False)
    assert out.dtype == dtype
    torch.testing.assert_close(out, out32.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 32, 70])  # tiles of 4 rows, and every remainder
@pytest.mark.parametrize("inputs,width", [(64, 16), (128, 48), (576, 1536)])  # 48: a tile of one pair
def test_silu_mul_in_the_same_pass_is_bitwise_the_two_kernels(native, dtype, rows, inputs, width):
    """int8_linear_silu_mul = silu_and_mul(int8_linear(x)) for weights of [gate | up] (2 * width outputs)."""
    g = torch.Generator().manual_seed(rows * 100 + width)
    x = (3 * torch.randn(rows, inputs, generator=g)).to(dtype)
    codes, scales = pack_int8(torch.randn(2 * width, inputs, generator=g))
    fused = native.int8_linear_silu_mul(x, codes, scales)
    assert fused.dtype == dtype and fused.shape == (rows, width)
    assert torch.equal(fused, native.silu_and_mul(native.int8_linear(x, codes, scales, False)))


def test_silu_mul_refuses_an_odd_number_of_weight_vectors(native):
    codes, scales = pack_int8(torch.randn(48, 64))  # 3 vectors of 16: no [gate | up] halves of whole vectors
    with pytest.raises(RuntimeError, match="even"):
        native.int8_linear_silu_mul(torch.randn(2, 64), codes, scales)


def test_a_row_does_not_depend_on_the_batch(native):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 576, generator=g).bfloat16()
    codes, scales = pack_int8(torch.randn(96, 576, generator=g))
    batch = native.int8_linear(x, codes, scales, True)
    for r in range(x.shape[0]):
        assert torch.equal(native.int8_linear(x[r:r + 1], codes, scales, True)[0], batch[r])


def test_calls_of_other_sizes_in_between_change_nothing(native):
    # the kernel keeps its quantized activations' buffers between calls: a large call, then a
    # small one, then both again on other thread counts, each as it is alone
    g = torch.Generator().manual_seed(11)
    big, small = torch.randn(64, 1536, generator=g).bfloat16(), torch.randn(3, 576, generator=g).bfloat16()
    big_w, small_w = pack_int8(torch.randn(48, 1536, generator=g)), pack_int8(torch.randn(32, 576, generator=g))
    first = native.int8_linear(big, *big_w, True)
    small_first = native.int8_linear(small, *small_w, True)
    torch.testing.assert_close(small_first, _reference(small, *small_w), rtol=1e-5, atol=1e-5)
    threads = torch.get_num_threads()
    try:
        # one thread; then more than quantize every row each (the rows quantized once, shared out)
        for count in (1, 6):
            torch.set_num_threads(count)
            assert torch.equal(native.int8_linear(big, *big_w, True), first)
            assert torch.equal(native.int8_linear(small, *small_w, True), small_first)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(native.int8_linear(big, *big_w, True), first)


def test_packing_keeps_each_output_within_half_a_step():
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(3))
    codes, scales = pack_int8(weight)
    assert codes.shape == (3, 32, 16, 4) and codes.dtype == torch.uint8
    torch.testing.assert_close(scales, weight.abs().amax(dim=1) / 127)
    err = (unpack_int8(codes, scales) - weight).abs()
    assert (err <= scales[:, None] / 2 * (1 + 1e-5)).all()


def test_bad_shapes_are_refused(native):
    codes, scales = pack_int8(torch.randn(16, 64))
    with pytest.raises(RuntimeError, match="in/4"):
        native.int8_linear(torch.randn(2, 96), codes, scales, False)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        native.int8_linear(torch.randn(2, 48), codes[:, :12].contiguous(), scales, False)
    with pytest.raises(RuntimeError, match="multiple of 64"):
        native.int8_linear(torch.randn(2, 96), pack_int8(torch.randn(16, 128))[0][:, :24].contiguous(), scales, False)
    with pytest.raises(AssertionError, match="out % 16"):
        pack_int8(torch.randn(20, 64))


def test_quantization_int8_runs_every_layer_on_int8_weights():
    from common.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.models.int8_linear import Int8LinearMethod
    from engine.models.linear import Linear

    engine = LLMEngine(EngineConfig(quantization="int8", dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20,
                                    max_model_len=256, max_num_seqs=4))
    layers = {name: m for name, m in engine.model.named_modules() if isinstance(m, Linear)}
    assert all(isinstance(m.method, Int8LinearMethod) for m in layers.values()), \
        {n: m.method.name for n, m in layers.items()}
    assert not engine.quantized  # no GGUF codes
    head = layers["lm_head"]
    x = torch.randn(3, head.input_size).bfloat16()
    exact = x.float() @ head.dense_weight().float().t()
    logits = head(x, float32_out=True)
    assert logits.dtype == torch.float32
    error = (logits - exact).abs().amax(dim=1) / exact.std(dim=1)
    print(f"int8 LM head: largest logit error / the row's spread {error.tolist()}")
    # int8 weights and activations are lossy: measured 0.10-0.12 of the spread at worst over the
    # 49,152 logits of a random row; a wrong scale or layout would be of the order of the spread
    assert (error < 0.25).all()
