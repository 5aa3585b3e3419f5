"""The default model's GGUF codes and the native kernel that runs on them.

- Reading: every Q4_1 / Q8_0 matrix of the shipped GGUF, de-quantized from our split codes
  (q / k rows un-permuted), equals bit for bit the float32 weight transformers' GGUF loader wrote
  into the converted folder: the codes are the shipped weights.
- Kernel: `quant_linear` on random codes of both formats, 1-19 input rows (every tail of the
  kernel's row pairs and 8-row panels), against float64 x @ dequantize()^T: relative error below
  1e-5 for float32 inputs and 1e-2 for bfloat16 (float32 and bfloat16 outputs); and a row's result
  is bitwise the same in any batch.
- Engine: the layers the codes run on, and the measured crossover, are in place; a batch above
  the crossover goes the dense way and still agrees with the codes.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from safetensors.torch import load_file

from common.default_model import ensure_default_model, find_gguf
from engine.models.gguf_codes import GroupCodes, read_group_codes


@pytest.fixture
def native(native_tier):
    return native_tier


@pytest.fixture(scope="module")
def shipped_codes() -> dict[str, GroupCodes]:
    return read_group_codes(find_gguf(), num_heads=9, num_kv_heads=3)


def test_codes_are_the_converted_weights_bit_for_bit(shipped_codes):
    weights = load_file(str(ensure_default_model() / "model.safetensors"))
    assert {c.format for c in shipped_codes.values()} == {"q4_1", "q8_0"}
    assert len(shipped_codes) == 30 * 7 + 1  # every layer matrix and the tied embedding
    for name, codes in shipped_codes.items():
        assert torch.equal(codes.dequantize(), weights[name]), name
    layer_bytes = sum(c.nbytes for c in shipped_codes.values() if c.format == "q4_1")
    layer_weights = sum(c.shape[0] * c.shape[1] for c in shipped_codes.values() if c.format == "q4_1")
    assert layer_bytes / layer_weights == 20 / 32  # 4-bit codes plus a float16 scale and minimum per 32


def _random_codes(fmt: str, out: int, inputs: int, seed: int) -> GroupCodes:
    g = torch.Generator().manual_seed(seed)
    groups = inputs // 32
    scales = (torch.rand(out, groups, generator=g) * 0.02 + 0.001).half()
    if fmt == "q8_0":
        return GroupCodes(fmt, torch.randint(-128, 128, (out, inputs), generator=g, dtype=torch.int8), scales, None)
    mins = (-torch.rand(out, groups, generator=g) * 0.1).half()
    return GroupCodes(fmt, torch.randint(0, 256, (out, inputs // 2), generator=g, dtype=torch.uint8), scales, mins)


def _run(native, codes: GroupCodes, x: torch.Tensor, float32_out: bool) -> torch.Tensor:
    return native.quant_linear(x, *codes.panels(), codes.format, float32_out)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("out,inputs", [(64, 128), (40, 576), (24, 1536)])
def test_quant_linear_matches_float64(native, fmt, dtype, tol, out, inputs):
    codes = _random_codes(fmt, out, inputs, seed=out + inputs)
    weight = codes.dequantize().double()
    for rows in (1, 2, 3, 8, 19):
        x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows)).to(dtype)
        ref = x.double() @ weight.T
        for float32_out in (True, False):
            got = _run(native, codes, x, float32_out)
            assert got.dtype == (torch.float32 if float32_out else dtype) and got.shape == (rows, out)
            err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            assert err < tol, (rows, float32_out, err)


def test_q4_words_hold_each_code_where_the_layout_says():
    """Q4_1's words, decoded by the layout's own rule (which the scalar kernel follows): step s,
    row pair h, word w -> row 8p + 2h + (w >> 1 & 1), position e = 2 (w >> 2) + (w & 1), nibble k ->
    group 2s + k // 2, element e + 16 (k % 2)."""
    codes = _random_codes("q4_1", 16, 128, seed=7)
    values = codes._q4_values()  # [out, groups, 32]
    words = codes.panels()[0].view(torch.int16).view(2, 2, 4, 32)  # [panel, step, pair, word]
    places = itertools.product(range(2), range(2), range(4), range(32))
    for (p, s, h, w), word in zip(places, words.flatten().tolist(), strict=True):
        word &= 0xFFFF
        row, e = 8 * p + 2 * h + (w >> 1 & 1), 2 * (w >> 2) + (w & 1)
        for k in range(4):
            assert (word >> 4 * k) & 0x0F == values[row, 2 * s + k // 2, e + 16 * (k % 2)], (p, s, h, w, k)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_linear_rows_do_not_depend_on_the_batch(native, fmt, dtype):
    codes = _random_codes(fmt, 48, 192, seed=3)
    x = torch.randn(13, 192, generator=torch.Generator().manual_seed(4)).to(dtype)
    whole = _run(native, codes, x, True)
    for start, stop in ((0, 1), (5, 6), (3, 7), (12, 13), (2, 11)):
        assert torch.equal(_run(native, codes, x[start:stop].clone(), True), whole[start:stop])


def test_quant_linear_refuses_bad_shapes(native):
    # Q4_1 steps hold two groups: an odd number of groups (or outputs off the 8-row panels) stays dense
    assert not _random_codes("q4_1", 16, 96, seed=5).panel_ready and _random_codes("q8_0", 16, 96, seed=5).panel_ready
    assert not _random_codes("q8_0", 12, 64, seed=5).panel_ready
    codes = _random_codes("q4_1", 16, 64, seed=5)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        native.quant_linear(torch.randn(1, 48), *codes.panels(), "q4_1", False)
    with pytest.raises(RuntimeError, match="codes"):
        native.quant_linear(torch.randn(1, 128), *codes.panels(), "q4_1", False)


def test_engine_runs_the_codes_and_agrees_across_the_crossover():
    from common.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.models.group_quantized import GroupQuantizedMethod
    from engine.models.linear import Linear

    engine = LLMEngine(EngineConfig(dtype="bfloat16", device="cpu", kv_cache_memory=64 << 20, max_model_len=512,
                                    max_num_seqs=16))
    layers = [m for m in engine.model.modules() if isinstance(m, Linear)]
    methods = [m.method for m in layers]
    assert engine.quantized and all(isinstance(m, GroupQuantizedMethod) for m in methods)
    assert {m.format for m in methods} == {"q4_1", "q8_0"}
    assert all(m.max_rows >= 1 for m in methods), [m.max_rows for m in methods]  # codes win at least one row
    layer, method = layers[0], methods[0]
    rows = method.max_rows + 5
    x = torch.randn(rows, layer.input_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    dense = layer(x)  # above the crossover: the dense bf16 weights
    codes = method.apply_codes(x)
    assert ((dense.float() - codes.float()).abs().max() / codes.float().abs().max()).item() < 2e-2


def test_which_gguf_runs(tmp_path):
    """auto: the default model on its codes, also when given by its folder (as the server passes
    it); another folder dense unless --quantization gguf finds a *.gguf there; none: dense."""
    from common.engine_config import EngineConfig
    from engine.models.gguf_codes import gguf_file

    default = ensure_default_model()
    assert gguf_file(EngineConfig(), default) == find_gguf()
    assert gguf_file(EngineConfig(model=str(default)), default) == find_gguf()
    assert gguf_file(EngineConfig(model=str(default), quantization="none"), default) is None
    assert gguf_file(EngineConfig(model=str(tmp_path)), tmp_path) is None
    with pytest.raises(ValueError, match="no \\*.gguf"):
        gguf_file(EngineConfig(model=str(tmp_path), quantization="gguf"), tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"")
    assert gguf_file(EngineConfig(model=str(tmp_path), quantization="gguf"), tmp_path) == tmp_path / "m.gguf"
