"""Q4_1 codes against int8 activations (engine/native/csrc/q4_int8_linear.cpp, `--batch-linear
int8`) against a plain-torch reference of the same arithmetic, and the layout it reads.

The reference quantizes each row's groups of 32 as the kernel does (float32 amax, scale 127 /
amax, round half to even), and multiplies those de-quantized activations by the exact
de-quantized Q4_1 weights in float64: the kernel's float32 sums must match it to float32
rounding.
"""
from __future__ import annotations

import pytest
import torch

from engine.models.gguf_codes import GroupCodes
from engine.native import load_tier, tiers


@pytest.fixture
def native(native_tier):
    if not native_tier.q4_int8_linear_available():
        pytest.skip(f"the {native_tier.tier} tier has no Q4_1 x int8 kernel (AVX512-VNNI and AVX2 have)")
    return native_tier


def _codes(outputs: int, inputs: int, seed: int) -> GroupCodes:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (outputs, inputs // 32, 32), dtype=torch.uint8, generator=g)
    scales = (torch.rand(outputs, inputs // 32, generator=g) * 0.02 + 1e-3).half()
    mins = (-torch.rand(outputs, inputs // 32, generator=g) * 0.1).half()
    packed = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(outputs, inputs // 2)  # the GGUF's byte order
    return GroupCodes("q4_1", packed.contiguous(), scales, mins)


def _reference(x: torch.Tensor, codes: GroupCodes) -> torch.Tensor:
    rows, inputs = x.shape
    groups = x.float().view(rows, inputs // 32, 32)
    amax = groups.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    x_int8 = (torch.round(groups * inv).double() * (amax / 127).double()).view(rows, inputs)
    return (x_int8 @ codes.dequantize().double().t()).float()


def _run(native, x: torch.Tensor, codes: GroupCodes, float32_out: bool) -> torch.Tensor:
    return native.q4_int8_linear(x, *codes.int8_tiles(), float32_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])  # tiles of 4 rows and every remainder
@pytest.mark.parametrize("inputs,outputs", [(64, 16), (576, 960), (1536, 576)])
def test_q4_int8_linear_matches_the_reference(native, dtype, rows, inputs, outputs):
    codes = _codes(outputs, inputs, rows * 1000 + outputs)
    x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows)).to(dtype)
    x[0, :32] = 0  # a group of zeros: scale 0, no division by it
    expected = _reference(x, codes)
    out32 = _run(native, x, codes, True)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    out = _run(native, x, codes, False)
    assert out.dtype == dtype
    torch.testing.assert_close(out, out32.to(dtype), rtol=0, atol=0)


def test_the_avx2_form_is_the_vnni_form_bitwise():
    """The AVX2 kernel's int16 pair sums give the same integer dots as VPDPBUSD, then the same
    float32 arithmetic: every tier with the kernel answers alike, to the bit."""
    runnable = [t for t in tiers.runnable() if load_tier(t).q4_int8_linear_available()]
    if len(runnable) < 2:
        pytest.skip(f"one tier with the kernel on this CPU ({[t.name for t in runnable]}): nothing to compare")
    codes = _codes(960, 576, 7)
    codes.codes[:16] = 0xFF  # the first 16 outputs' codes all 15: with all-equal activations
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(7))
    x[:4] = torch.tensor([1.0, -1.0, 0.5, -0.25]).unsqueeze(1)  # (codes 127 or -127), the int16 sums at their bound
    first, *others = [_run(load_tier(t), x, codes, True) for t in runnable]
    for tier, out in zip(runnable[1:], others, strict=True):
        torch.testing.assert_close(out, first, rtol=0, atol=0, msg=f"{tier.name} vs {runnable[0].name}")


def test_a_row_does_not_depend_on_the_batch(native):
    codes = _codes(96, 576, 7)
    x = torch.randn(7, 576, generator=torch.Generator().manual_seed(7)).bfloat16()
    batch = _run(native, x, codes, True)
    for r in range(x.shape[0]):
        assert torch.equal(_run(native, x[r:r + 1], codes, True)[0], batch[r])


@pytest.mark.parametrize("threads", [1, 6])
def test_the_thread_count_changes_nothing(native, threads):
    # up to four threads each quantizes every row itself; more share the quantization out
    codes = _codes(96, 576, 8)
    x = torch.randn(33, 576, generator=torch.Generator().manual_seed(8)).bfloat16()
    before = _run(native, x, codes, True)
    default = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert torch.equal(_run(native, x, codes, True), before)
    finally:
        torch.set_num_threads(default)


def test_the_tiles_hold_every_code_once():
    codes = _codes(32, 128, 3)
    tiles, scales, mins = codes.int8_tiles()
    assert tiles.shape == (2, 4, 4, 64) and scales.shape == mins.shape == (2, 4, 16)
    # byte b of vector t: output b // 4, input 4t + b % 4 (low nibble) and 4(t + 4) + b % 4 (high)
    low, high = (tiles & 0x0F).view(2, 4, 4, 16, 4), (tiles >> 4).view(2, 4, 4, 16, 4)
    per_quad = torch.cat((low, high), dim=2)  # [tile, group, quad, output, 4]
    q = per_quad.permute(0, 3, 1, 2, 4).reshape(32, 128)
    assert torch.equal(q, codes._q4_values().view(32, 128))
    assert torch.equal(scales.transpose(1, 2).reshape(32, 4), codes.scales)
    assert torch.equal(mins.transpose(1, 2).reshape(32, 4), codes.mins)


def test_bad_shapes_are_refused(native):
    tiles, scales, mins = _codes(16, 64, 1).int8_tiles()
    with pytest.raises(RuntimeError, match="in/32"):
        native.q4_int8_linear(torch.randn(2, 96), tiles, scales, mins, False)
    with pytest.raises(RuntimeError, match="float16"):
        native.q4_int8_linear(torch.randn(2, 64), tiles, scales.float(), mins, False)
    with pytest.raises(AssertionError):
        _codes(24, 64, 1).int8_tiles()  # outputs not a multiple of 16
