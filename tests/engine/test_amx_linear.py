"""The GGUF codes as bf16 tiles on AMX (engine/native/csrc/amx_linear.cpp, `--batch-linear amx`)
against the dense bf16 weights they stand for, and the layout it reads.

The kernel's weights must be exactly GroupCodes.dequantize() rounded to bfloat16 (one-hot rows
read them back bit for bit), its float32 sums those weights times the bf16 inputs to float32
rounding (a float64 reference), and a row's result must not depend on the rows beside it.
"""
from __future__ import annotations

import pytest
import torch

from engine.models.gguf_codes import GroupCodes


@pytest.fixture
def native(native_tier):
    if not native_tier.amx_linear_available():
        pytest.skip(f"the {native_tier.tier} tier has no AMX tiles, or this process may not use them")
    return native_tier


def _codes(fmt: str, outputs: int, inputs: int, seed: int) -> GroupCodes:
    g = torch.Generator().manual_seed(seed)
    scales = (torch.rand(outputs, inputs // 32, generator=g) * 0.02 + 1e-3).half()
    if fmt == "q8_0":
        q8 = torch.randint(-128, 128, (outputs, inputs), dtype=torch.int8, generator=g)
        return GroupCodes("q8_0", q8, scales, None)
    q = torch.randint(0, 16, (outputs, inputs // 32, 32), dtype=torch.uint8, generator=g)
    mins = (-torch.rand(outputs, inputs // 32, generator=g) * 0.1).half()
    packed = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(outputs, inputs // 2)  # the GGUF's byte order
    return GroupCodes("q4_1", packed.contiguous(), scales, mins)


def _run(native, x: torch.Tensor, codes: GroupCodes, float32_out: bool) -> torch.Tensor:
    return native.amx_linear(x, *codes.amx_tiles(), codes.format, float32_out)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_the_weights_are_the_dense_bf16_ones_exactly(native, fmt):
    codes = _codes(fmt, 64, 96, 1)
    eye = torch.eye(96, dtype=torch.bfloat16)  # row k picks input k: out[k, n] = w[n, k]
    assert torch.equal(_run(native, eye, codes, True), codes.dequantize().bfloat16().float().t())


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 32, 33, 70])  # tiles of 16 rows, chunks of 32, remainders
@pytest.mark.parametrize("inputs,outputs", [(64, 32), (576, 960), (1536, 576)])
def test_amx_linear_matches_the_dense_weights(native, fmt, rows, inputs, outputs):
    codes = _codes(fmt, outputs, inputs, rows * 1000 + outputs)
    x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows)).bfloat16()
    expected = (x.double() @ codes.dequantize().bfloat16().double().t()).float()
    out32 = _run(native, x, codes, True)
    assert out32.dtype == torch.float32 and out32.shape == (rows, outputs)
    torch.testing.assert_close(out32, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    out = _run(native, x, codes, False)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, out32.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 17, 32, 33, 70])
@pytest.mark.parametrize("inputs,width", [(64, 16), (576, 1536)])
def test_silu_mul_in_the_same_pass_is_bitwise_the_two_kernels(native, fmt, rows, inputs, width):
    """amx_linear_silu_mul = silu_and_mul(amx_linear(x)) for the codes of [gate | up] (2 * width outputs)."""
    codes = _codes(fmt, 2 * width, inputs, rows + width)
    x = (3 * torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows))).bfloat16()
    fused = native.amx_linear_silu_mul(x, *codes.amx_tiles(), codes.format)
    assert fused.dtype == torch.bfloat16 and fused.shape == (rows, width)
    assert torch.equal(fused, native.silu_and_mul(_run(native, x, codes, False)))


def test_a_row_does_not_depend_on_the_batch(native):
    codes = _codes("q4_1", 96, 576, 7)
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(7)).bfloat16()
    batch = _run(native, x, codes, True)
    for r in (0, 15, 16, 31, 32, 39):
        assert torch.equal(_run(native, x[r:r + 1], codes, True)[0], batch[r])


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_the_tiles_hold_every_code_once(fmt):
    codes = _codes(fmt, 32, 64, 3)
    tiles, scales, mins = codes.amx_tiles()
    assert scales.shape == (2, 2, 16) and torch.equal(scales.transpose(1, 2).reshape(32, 2), codes.scales)
    if fmt == "q4_1":
        assert tiles.shape == (2, 2, 8, 32) and torch.equal(mins.transpose(1, 2).reshape(32, 2), codes.mins)
        # block s: output 2s in the low nibbles, 2s + 1 in the high ones
        rows = torch.stack((tiles & 0x0F, tiles >> 4), dim=3).reshape(2, 2, 16, 32)
        values = codes._q4_values()
    else:
        assert tiles.shape == (2, 2, 16, 32) and mins.numel() == 0
        rows, values = tiles, codes.codes.view(32, 2, 32)
    # [tile, group, output, input] -> [output, group, input]
    assert torch.equal(rows.transpose(1, 2).reshape(32, 2, 32), values)


def test_inputs_the_kernel_refuses(native):
    codes = _codes("q4_1", 32, 64, 5)
    with pytest.raises(RuntimeError, match="bf16"):
        _run(native, torch.randn(2, 64), codes, False)  # float32
    with pytest.raises(RuntimeError, match="do not match"):
        _run(native, torch.randn(2, 96).bfloat16(), codes, False)
