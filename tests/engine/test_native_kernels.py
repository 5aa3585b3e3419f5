"""The native CPU kernels against the torch paths they replace (engine/native).

Paged decode attention: random caches with shuffled block tables, sequences of mixed lengths
(short, one block, long enough to be split over several parallel key ranges), GQA groups of 1,
3 and 4 query heads, head sizes 64 and 128, blocks of 16 and 32; relative error against the torch
backend's one-query path below 1e-5 in float32 and 1e-2 in bfloat16, and against float64 softmax
attention. Skipped only where the extension cannot be built (the engine then runs the torch
path), which the test says.
"""
from __future__ import annotations

import pytest
import torch

from engine.attention.torch_paged import TorchPagedBackend, TorchPagedMetadata
from engine.models.layers import RMSNorm


@pytest.fixture
def native(native_tier):
    return native_tier


def _case(dtype, num_kv_heads, group, head_dim, block_size, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum((n + block_size - 1) // block_size for n in lens) + 8
    k_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype)
    width = max((n + block_size - 1) // block_size for n in lens)
    tables = torch.randint(0, num_blocks, (len(lens), width), generator=g, dtype=torch.int32)  # shared blocks allowed
    q = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


def _torch_path(q, k_cache, v_cache, tables, seq_lens, scale):
    num_kv_heads, _, block_size, head_dim = k_cache.shape
    backend = TorchPagedBackend(q.shape[1], num_kv_heads, head_dim, block_size)
    past_end = torch.arange(tables.shape[1] * block_size).unsqueeze(0) >= seq_lens.unsqueeze(1)
    meta = TorchPagedMetadata(torch.zeros(len(seq_lens), dtype=torch.long), len(seq_lens), tables,
                              past_end.repeat(num_kv_heads, 1).unsqueeze(1), [])
    return backend._single_query_attention(q, k_cache, v_cache, meta, scale)


def _float64(q, k_cache, v_cache, tables, seq_lens, scale):
    num_kv_heads, _, _, head_dim = k_cache.shape
    group = q.shape[1] // num_kv_heads
    out = []
    for i, n in enumerate(seq_lens.tolist()):
        keys = k_cache[:, tables[i].long()].reshape(num_kv_heads, -1, head_dim)[:, :n].double()
        values = v_cache[:, tables[i].long()].reshape(num_kv_heads, -1, head_dim)[:, :n].double()
        qi = q[i].double().view(num_kv_heads, group, head_dim)
        out.append((torch.softmax(qi @ keys.transpose(1, 2) * scale, -1) @ values).reshape(-1, head_dim))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,group,head_dim,block_size", [(3, 3, 64, 16), (2, 4, 128, 16), (4, 1, 64, 32)])
def test_paged_decode_attention_matches_the_torch_path(native, dtype, num_kv_heads, group, head_dim, block_size):
    lens = [1, 7, block_size, 200, 513, 1500, 64]
    q, k_cache, v_cache, tables, seq_lens = _case(dtype, num_kv_heads, group, head_dim, block_size, lens)
    scale = head_dim ** -0.5
    got = native.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    want = _torch_path(q, k_cache, v_cache, tables, seq_lens, scale)
    exact = _float64(q, k_cache, v_cache, tables, seq_lens, scale)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert got.shape == want.shape and got.dtype == dtype
    relative = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert relative < tolerance, f"against the torch path: {relative:.2e}"
    relative_exact = ((got.double() - exact).abs().max() / exact.abs().max()).item()
    assert relative_exact < tolerance, f"against float64: {relative_exact:.2e}"


def test_a_row_does_not_depend_on_the_batch(native):
    """Each (sequence, kv head, key range) is computed on its own, so a row is bitwise the same
    alone and among others."""
    q, k_cache, v_cache, tables, seq_lens = _case(torch.bfloat16, 3, 3, 64, 16, [700, 5, 300, 1200])
    together = native.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    for i in range(len(seq_lens)):
        alone = native.paged_decode_attention(q[i:i + 1], k_cache, v_cache, tables[i:i + 1], seq_lens[i:i + 1], 0.125)
        assert torch.equal(alone[0], together[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_thread_gives_the_threads_result(native, dtype):
    """One thread runs every work item inline (the parallel loop's single chunk of everything)."""
    q, k_cache, v_cache, tables, seq_lens = _case(dtype, 3, 3, 64, 16, [700, 5, 300, 1200])
    threaded = native.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = native.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, threaded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_fused_add_rms_norm_matches_the_torch_path(native, dtype, with_residual):
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(576, 1e-5)
    norm.weight.data = (1 + 0.1 * torch.randn(576, generator=g))
    norm = norm.to(dtype)
    for rows in (1, 7, 64, 300):
        x = (3 * torch.randn(rows, 576, generator=g)).to(dtype)
        residual = torch.randn(rows, 576, generator=g).to(dtype) if with_residual else None
        want = norm(x, residual)
        got = native.fused_add_rms_norm(x, residual, norm.weight.detach(), norm.eps)
        want_out, want_sum = want if with_residual else (want, x)
        assert torch.equal(got[1], want_sum), "the residual sum rounds as the torch path's"
        relative = ((got[0].float() - want_out.float()).abs().max() / want_out.float().abs().max()).item()
        assert relative < (1e-5 if dtype == torch.float32 else 1e-2), f"{rows} rows: {relative:.2e}"
        alone = native.fused_add_rms_norm(x[-1:], None if residual is None else residual[-1:], norm.weight.detach(),
                                          norm.eps)
        assert torch.equal(alone[0][0], got[0][-1]), "a row does not depend on the others"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 2, 128)])
def test_rope_write_kv_matches_the_torch_path(native, dtype, heads, kv_heads, head_dim):
    """RoPE on q and k of strided views of a fused qkv row, and the K/V cache write, against
    apply_rope + write_kv: bitwise equal (the same rounding points), and only the step's slots
    of the caches change."""
    from engine.attention.torch_paged import write_kv
    from engine.models.layers import RotaryEmbedding, apply_rope

    g = torch.Generator().manual_seed(heads + head_dim)
    tokens, block_size, num_blocks = 11, 16, 6
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4000, (tokens,), generator=g)
    rope = RotaryEmbedding(head_dim, 4096, 10000.0, None).cos_sin(positions, dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    caches = [torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=g).to(dtype) for _ in range(2)]
    caches += [c.clone() for c in caches]
    q_ref, k_ref = apply_rope(qk, *rope).split((heads, kv_heads), dim=1)
    write_kv(caches[0], caches[1], k_ref, v, slots)
    q, k = native.rope_write_kv(qk, v, *rope, caches[2], caches[3], slots, heads)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_matches_the_torch_path(native, dtype):
    """Against F.silu(gate) * up: float32 within 1e-6 relative (the exp differs in its last bits),
    bfloat16 equal except where such a bit moves a rounding (at most 1 in 1000 elements, one
    bfloat16 step)."""
    import torch.nn.functional as F

    x = (torch.randn(7, 2 * 1536, generator=torch.Generator().manual_seed(7)) * 4).to(dtype)
    x[0, :6] = torch.tensor([-100.0, -88.0, 0.0, 30.0, 90.0, -0.0])  # the clamps of the exp and signed zero
    gate, up = x.split(1536, dim=-1)
    ref = F.silu(gate) * up
    got = native.silu_and_mul(x)
    assert got.dtype == dtype and got.shape == ref.shape
    if dtype == torch.float32:
        assert ((got - ref).abs() / ref.abs().clamp_min(1e-30)).max().item() < 1e-6
    else:
        differ = got != ref
        assert differ.float().mean().item() < 1e-3
        assert ((got.float() - ref.float()).abs()[differ] <= ref.float().abs()[differ] * 2**-7).all()


def _test_distributions(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows of every kind a sampler meets: flat, peaked, mostly zero (top-k), with exact ties."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * torch.linspace(0.5, 8, rows).unsqueeze(1)
    logits[rows // 4: rows // 2, vocab // 3:] = float("-inf")  # a top-k'd row: most tokens impossible
    logits[rows // 2: rows // 2 + 4, :: 7] = logits[rows // 2: rows // 2 + 4, :1]  # exact ties
    return logits.softmax(dim=-1)


@pytest.mark.parametrize("vocab", [50, 1000, 49152, 151936])
def test_inverse_cdf_draws_inside_the_token_slice(native, vocab):
    """The native draw against the torch path's on the same uniforms: each token holds u x total in
    its own slice of the float64 cumulative distribution (up to float32 rounding), never a
    zero-probability token, and the same token as the torch path's but at slice edges."""
    from engine.sample.filters import _inverse_cdf

    probs = _test_distributions(64, vocab, seed=vocab)
    u = torch.rand(64, generator=torch.Generator().manual_seed(1))
    u[0], u[1] = 0.0, 1.0 - 2.0**-24  # the ends of torch.rand's range
    ours, theirs = native.inverse_cdf(probs, u), _inverse_cdf(probs, u)
    cdf = probs.double().cumsum(dim=-1)
    target = u.double() * cdf[:, -1]
    chosen = probs.gather(1, ours.unsqueeze(1)).squeeze(1)
    assert (chosen > 0).all()
    lo = cdf.gather(1, ours.unsqueeze(1)).squeeze(1) - chosen.double()
    hi = cdf.gather(1, ours.unsqueeze(1)).squeeze(1)
    assert ((lo <= target + 1e-5) & (target <= hi + 1e-5)).all()
    assert (ours == theirs).float().mean().item() >= 0.95


@pytest.mark.parametrize("vocab", [50, 49152])
def test_nucleus_ok_matches_the_torch_path(native, vocab):
    """top-p and min-p acceptance of drawn tokens, ties ranked by id: the torch path's answers."""
    from engine.sample.filters import _inside

    probs = _test_distributions(64, vocab, seed=2)
    g = torch.Generator().manual_seed(3)
    token = torch.multinomial(probs, 1, generator=g).squeeze(1)
    token[32:36] = 0  # a tied token (column 0 is tied with every 7th)
    top_p = torch.rand(64, generator=g)
    top_p[::5] = 1.0
    min_p = torch.rand(64, generator=g) * 0.2
    best = probs.amax(dim=-1)
    for tp, mp in ((top_p, None), (None, min_p), (top_p, min_p)):
        ours = native.nucleus_ok(probs, token, tp, mp, best if mp is not None else None)
        assert torch.equal(ours, _inside(probs, token, tp, mp, best if mp is not None else None))


@pytest.mark.parametrize("vocab", [1, 17, 1000, 49152])
def test_argmax_rows_is_torch_argmax(native, vocab):
    """The greedy choice: torch.argmax's index on every row, ties to the first, a NaN first."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(40, vocab, generator=g) * 4
    logits[1] = float("-inf")  # every token banned: index 0, as torch
    logits[2, vocab // 2:] = logits[2].max() + 1  # a tie spanning vectors: the first of it
    logits[3, -1] = float("inf")
    logits[4, vocab // 3] = float("nan")
    logits[5, -1], logits[5, 0] = float("nan"), float("nan")
    logits[6] = 0.0
    logits[6, vocab - 1] = -0.0  # -0 equals 0: still the first
    logits[7] = logits[7].round()  # many exact ties
    assert torch.equal(native.argmax_rows(logits), logits.argmax(dim=-1))
    assert torch.equal(native.argmax_rows(logits[:1]), logits[:1].argmax(dim=-1))
