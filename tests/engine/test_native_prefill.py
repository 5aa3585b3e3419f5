"""The native prefill attention kernel (engine/native/csrc/prefill_attention.cpp) against the torch
path it replaces (gather the blocks, SDPA per chunk) and against float64 softmax attention.

Random float32 and bfloat16 caches with shuffled block tables; chunks that are whole sequences and
chunks after a cached prefix, of 1 to 200 queries, side by side in one call; GQA groups of 1, 3
and 4 query heads, head sizes 64 and 128, blocks of 8, 16 and 32. Relative error below 1e-2 in
bfloat16 and 1e-5 in float32. Then the backend: a mixed step (one-query rows, then prompt chunks)
attended with the kernel and without it. On every kernel tier but the scalar one (which has no
prefill kernel: the engine then runs the torch path).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.attention.base import StepInputs
from engine.attention.torch_paged import TorchPagedBackend, _chunk_attention, gather_blocks


@pytest.fixture
def native(native_tier):
    if not native_tier.prefill_attention_available():
        pytest.skip(f"the {native_tier.tier} tier has no native prefill attention")
    return native_tier

# (query_len, context_len): whole sequences and chunks after cached tokens
CHUNKS = [(158, 158), (5, 5), (37, 300), (200, 513), (1, 40), (17, 17), (64, 64)]


def _case(num_kv_heads, group, head_dim, block_size, chunks, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    width = max((n + block_size - 1) // block_size for _, n in chunks)
    num_blocks = len(chunks) * width + 4
    k_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype)
    # every chunk its own blocks, in a shuffled order
    tables = torch.randperm(num_blocks, generator=g)[:len(chunks) * width].view(len(chunks), width).int()
    starts = np.cumsum([0] + [query_len for query_len, _ in chunks]).astype(np.int32)
    q = torch.randn(int(starts[-1]), num_kv_heads * group, head_dim, generator=g).to(dtype)
    lens = torch.tensor([n for _, n in chunks], dtype=torch.int32)
    return q, k_cache, v_cache, tables, torch.from_numpy(starts), lens


def _torch_path(q, k_cache, v_cache, tables, starts, lens, scale, dtype=torch.bfloat16):
    """The backend's chunk path, chunk by chunk: gather the blocks, SDPA with the causal mask."""
    out = torch.empty(q.shape, dtype=dtype)
    for c, n in enumerate(lens.tolist()):
        rows = slice(int(starts[c]), int(starts[c + 1]))
        query_len = rows.stop - rows.start
        keys = gather_blocks(k_cache, tables[c], k_cache.dtype)[:, :n].to(dtype)
        values = gather_blocks(v_cache, tables[c], v_cache.dtype)[:, :n].to(dtype)
        mask = torch.arange(n).unsqueeze(0) <= torch.arange(n - query_len, n).unsqueeze(1)
        out[rows] = _chunk_attention(q[rows].to(dtype), keys, values, mask, scale)
    return out


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
@pytest.mark.parametrize("num_kv_heads,group,head_dim,block_size",
                         [(3, 3, 64, 16), (2, 4, 128, 16), (4, 1, 64, 32), (3, 3, 64, 8)])
def test_paged_prefill_attention_matches_the_torch_path(native, dtype, tolerance, num_kv_heads, group, head_dim,
                                                        block_size):
    q, k_cache, v_cache, tables, starts, lens = _case(num_kv_heads, group, head_dim, block_size, CHUNKS, dtype=dtype)
    scale = head_dim ** -0.5
    got = native.paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens, scale)
    want = _torch_path(q, k_cache, v_cache, tables, starts, lens, scale, dtype)
    exact = _torch_path(q, k_cache, v_cache, tables, starts, lens, scale, torch.float64)
    assert got.shape == q.shape and got.dtype == dtype
    relative = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert relative < tolerance, f"against the torch path: {relative:.2e}"
    relative_exact = ((got.double() - exact).abs().max() / exact.abs().max()).item()
    assert relative_exact < tolerance, f"against float64: {relative_exact:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_chunk_does_not_depend_on_the_batch(native, dtype):
    """Each (chunk, kv head, query tile) is computed on its own: a chunk's rows are bitwise the
    same alone and among others."""
    q, k_cache, v_cache, tables, starts, lens = _case(3, 3, 64, 16, CHUNKS, dtype=dtype)
    together = native.paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens, 0.125)
    for c in range(len(lens)):
        rows = slice(int(starts[c]), int(starts[c + 1]))
        alone = native.paged_prefill_attention(q[rows].contiguous(), k_cache, v_cache, tables[c:c + 1],
                                               torch.tensor([0, rows.stop - rows.start], dtype=torch.int32),
                                               lens[c:c + 1], 0.125)
        assert torch.equal(alone, together[rows])


def test_bad_input_is_refused(native):
    q, k_cache, v_cache, tables, starts, lens = _case(3, 3, 64, 16, [(8, 8)])
    with pytest.raises(RuntimeError, match="the caches in its dtype"):
        native.paged_prefill_attention(q.float(), k_cache, v_cache, tables, starts, lens, 0.125)
    with pytest.raises(RuntimeError, match="holds its queries"):
        native.paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens - 1, 0.125)


def _mixed_step(block_size: int, singles: list[int], chunks: list[tuple[int, int]], max_blocks: int) -> StepInputs:
    """One-query requests (their context lengths), then prompt chunks (query_len, context_len),
    request i on blocks i * max_blocks ..."""
    query_lens = [1] * len(singles) + [query_len for query_len, _ in chunks]
    seq_lens = np.array(singles + [n for _, n in chunks], dtype=np.int32)
    qsl = np.cumsum([0] + query_lens).astype(np.int32)
    computed = seq_lens - np.array(query_lens, dtype=np.int32)
    positions = np.concatenate([np.arange(c, n) for c, n in zip(computed, seq_lens, strict=True)])
    table = torch.arange(len(seq_lens) * max_blocks, dtype=torch.int32).view(len(seq_lens), max_blocks)
    request = np.repeat(np.arange(len(seq_lens)), query_lens)
    slots = table.numpy()[request, positions // block_size] * block_size + positions % block_size
    return StepInputs(len(seq_lens), int(qsl[-1]), block_size, torch.from_numpy(qsl), qsl,
                      torch.from_numpy(seq_lens), seq_lens, computed, torch.from_numpy(positions),
                      torch.from_numpy(slots.astype(np.int64)), table)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_backend_attends_a_mixed_step_as_without_the_kernel(native, dtype):
    heads, kv_heads, head_dim, block_size, max_blocks = 9, 3, 64, 16, 16
    inputs = _mixed_step(block_size, [30, 200], [(100, 100), (40, 250)], max_blocks)
    g = torch.Generator().manual_seed(3)
    shape = (kv_heads, inputs.num_reqs * max_blocks, block_size, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(inputs.num_tokens, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(inputs.num_tokens, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(inputs.num_tokens, kv_heads, head_dim, generator=g).to(dtype)
    outs = []
    for kernels_on in (True, False):
        backend = TorchPagedBackend(heads, kv_heads, head_dim, block_size, native if kernels_on else None,
                                    kv_cache_dtype=dtype)
        meta = backend.build_metadata(inputs)
        assert (meta.native_prefill is not None) == kernels_on
        outs.append(backend.forward(q, k, v, (k_cache.clone(), v_cache.clone()), meta, 0.125))
    relative = ((outs[0].float() - outs[1].float()).abs().max() / outs[1].float().abs().max()).item()
    assert relative < 1e-2, f"{relative:.2e}"
