"""The int8 KV cache (`--kv-cache-dtype int8`: engine/attention/kv_int8.py, engine/native/csrc/kv_int8.h).

- The codec: every element within half a step (scale / 2) of its input, zero rows kept zero, the
  scale in the row's last 4 bytes.
- The native KV write (rope_write_kv) into int8 caches: bitwise the torch path's (apply_rope, then
  write_kv quantizing), only the step's slots changed.
- Native decode attention over int8 caches: bitwise the same kernel over the caches de-quantized
  by the torch codec (the kernel de-quantizes a split at a time, the same float32 operations),
  and against the torch backend's own one-query path over the int8 caches (1e-5 float32, 1e-2
  bfloat16 relative) and float64 attention on the de-quantized rows.
- The whole engine: perplexity of the default model on the shipped text's first 256 tokens, fed
  one token per step (every step attends the cache through the decode kernel) and 32 per step
  (prefill chunks gather and de-quantize the cached prefix), within 1 % of the bfloat16 cache's;
  a cache row is 68 bytes instead of 128.
"""
from __future__ import annotations

import pytest
import torch

from engine.attention import create_backend
from engine.attention.kv_int8 import SCALE_BYTES, dequantize_rows, quantize_rows
from engine.attention.torch_paged import TorchPagedBackend, TorchPagedMetadata, write_kv


@pytest.fixture
def native(native_tier):
    return native_tier


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codec_rounds_each_element_by_at_most_half_a_step(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(50, 3, 64, generator=g) * torch.logspace(-3, 2, 50).view(50, 1, 1)).to(dtype)
    x[0, 0] = 0  # an all-zero row
    rows = quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, 64 + SCALE_BYTES)
    scale = rows[..., 64:].contiguous().view(torch.float32)
    assert torch.equal(scale, x.float().abs().amax(-1, keepdim=True) / 127)
    assert rows[..., :64].abs().max().item() <= 127
    back = dequantize_rows(rows, torch.float32)
    assert ((back - x.float()).abs() <= scale / 2 + x.float().abs() * 2**-22).all()  # + float32 rounding
    assert torch.equal(dequantize_rows(rows, dtype)[0, 0], torch.zeros(64, dtype=dtype))
    assert dequantize_rows(rows, dtype).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 2, 128)])
def test_native_kv_write_into_int8_caches_equals_the_torch_path(native, dtype, heads, kv_heads, head_dim):
    from engine.models.layers import RotaryEmbedding, apply_rope

    g = torch.Generator().manual_seed(heads + head_dim)
    tokens, block_size, num_blocks = 11, 16, 6
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    rope = RotaryEmbedding(head_dim, 4096, 10000.0, None).cos_sin(torch.randint(0, 4000, (tokens,), generator=g),
                                                                   dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    shape = (kv_heads, num_blocks, block_size, head_dim + SCALE_BYTES)
    caches = [torch.randint(-127, 128, shape, generator=g, dtype=torch.int8) for _ in range(2)]
    caches += [c.clone() for c in caches]
    before = caches[0].clone()
    q_ref, k_ref = apply_rope(qk, *rope).split((heads, kv_heads), dim=1)
    write_kv(caches[0], caches[1], k_ref, v, slots)
    q, k = native.rope_write_kv(qk, v, *rope, caches[2], caches[3], slots, heads)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    changed = (caches[0] != before).any(-1).view(kv_heads, -1).any(0).nonzero().flatten()
    assert set(changed.tolist()) <= set(slots.tolist())


def _int8_case(dtype, num_kv_heads, group, head_dim, block_size, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum((n + block_size - 1) // block_size for n in lens) + 8
    k_cache = quantize_rows(torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype))
    v_cache = quantize_rows(torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype))
    width = max((n + block_size - 1) // block_size for n in lens)
    tables = torch.randint(0, num_blocks, (len(lens), width), generator=g, dtype=torch.int32)
    q = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


def _torch_one_query_path(q, k_cache, v_cache, tables, seq_lens, scale):
    num_kv_heads, _, block_size, _ = k_cache.shape
    backend = TorchPagedBackend(q.shape[1], num_kv_heads, q.shape[2], block_size, kv_cache_dtype=torch.int8)
    past_end = torch.arange(tables.shape[1] * block_size).unsqueeze(0) >= seq_lens.unsqueeze(1)
    meta = TorchPagedMetadata(torch.zeros(len(seq_lens), dtype=torch.long), len(seq_lens), tables,
                              past_end.repeat(num_kv_heads, 1).unsqueeze(1), [])
    return backend._single_query_attention(q, k_cache, v_cache, meta, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,group,head_dim,block_size", [(3, 3, 64, 16), (2, 4, 128, 16), (4, 1, 48, 32)])
def test_decode_attention_over_int8_caches(native, dtype, num_kv_heads, group, head_dim, block_size):
    lens = [1, 7, block_size, 200, 513, 64]
    q, k_cache, v_cache, tables, seq_lens = _int8_case(dtype, num_kv_heads, group, head_dim, block_size, lens)
    scale = head_dim ** -0.5
    got = native.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    k_rows, v_rows = dequantize_rows(k_cache, dtype), dequantize_rows(v_cache, dtype)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(got, native.paged_decode_attention(q, k_rows, v_rows, tables, seq_lens, scale))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    ref = _torch_one_query_path(q, k_cache, v_cache, tables, seq_lens, scale).float()
    assert ((got.float() - ref).norm() / ref.norm()).item() < tol
    for i, n in enumerate(lens):  # float64 softmax attention on the de-quantized rows
        keys = k_rows[:, tables[i].long()].reshape(num_kv_heads, -1, head_dim)[:, :n].double()
        values = v_rows[:, tables[i].long()].reshape(num_kv_heads, -1, head_dim)[:, :n].double()
        qi = q[i].double().view(num_kv_heads, group, head_dim)
        exact = (torch.softmax(qi @ keys.transpose(1, 2) * scale, -1) @ values).reshape(-1, head_dim)
        assert ((got[i].double() - exact).norm() / exact.norm()).item() < tol


def test_int8_rows_are_head_dim_plus_their_scale_and_only_the_torch_backend_takes_them():
    from engine.runner.kv_cache import bytes_per_block

    backend = create_backend("torch-paged", 9, 3, 64, 16, None, torch.int8)
    assert backend.kv_cache_shape(10) == (3, 10, 16, 68)

    class Arch:
        num_layers, num_kv_heads, head_dim = 30, 3, 64

    assert bytes_per_block(Arch, 16, torch.int8) * 128 == bytes_per_block(Arch, 16, torch.bfloat16) * 68
    with pytest.raises(ValueError, match="kv-cache-dtype"):
        create_backend("triton-paged", 9, 3, 64, 16, None, torch.int8)


@pytest.mark.slow
def test_perplexity_with_the_int8_cache_is_within_one_percent_of_the_bf16_cache():
    from benchmarks.perplexity import build_engine, engine_perplexity

    window, tokens = 256, 256
    figures = {}
    for kv in ("auto", "int8"):
        engine = build_engine("gguf-bf16", window, kv)
        assert engine.kv_cache_dtype == (torch.int8 if kv == "int8" else torch.bfloat16)
        for chunk in (1, 32):
            figures[kv, chunk] = engine_perplexity(engine, window, chunk, tokens)
    print("perplexity, first 256 tokens:", {f"{kv} cache, {c} per step": round(v, 4) for (kv, c), v in figures.items()})
    for chunk in (1, 32):
        assert abs(figures["int8", chunk] / figures["auto", chunk] - 1) < 0.01
