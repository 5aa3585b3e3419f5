"""The CUDA attention backend's Triton kernels (engine/attention/triton_kernels.py) against the
torch backend, on mixed batches of decodes and prefill chunks over a paged cache.

On CPU the kernels run under Triton's interpreter (float32 and float16: the interpreter has no
bfloat16); the GPU check runs the same tests on CUDA (LLM_TEST_DEVICE=cuda), bfloat16 too. The
engine-level test runs a tiny model on the triton-paged backend against transformers' logits.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_model_parity import hf_logits, new_request, run_rows
from device_under_test import TEST_DEVICE

from common.engine_config import EngineConfig
from engine.attention.base import StepInputs
from engine.attention.torch_paged import TorchPagedBackend
from engine.llm_engine import LLMEngine

DEVICE = torch.device(TEST_DEVICE)
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
# max abs error against the torch backend in float32, on unit-variance data
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_step(specs: list[tuple[int, int]], block_size: int, num_blocks: int, seed: int,
              invariant_last: int = 0) -> StepInputs:
    """specs: per request (tokens cached before the step, query rows this step), one-query
    requests first; each request's blocks drawn at random from the pool, no two sharing one."""
    rnd = np.random.default_rng(seed)
    computed = np.array([c for c, _ in specs], np.int64)
    query_lens = np.array([q for _, q in specs], np.int64)
    seq_lens = computed + query_lens
    width = int(-(-seq_lens.max() // block_size))
    pool = rnd.permutation(num_blocks)
    table = np.zeros((len(specs), width), np.int32)
    used = 0
    for i, length in enumerate(seq_lens):
        n = int(-(-length // block_size))
        table[i, :n] = pool[used:used + n]
        table[i, n:] = pool[0]  # stale but valid ids past the sequence's blocks
        used += n
    assert used <= num_blocks
    qsl = np.concatenate([[0], np.cumsum(query_lens)])
    request_of_token = np.repeat(np.arange(len(specs)), query_lens)
    positions = computed[request_of_token] + np.arange(int(qsl[-1])) - qsl[request_of_token]
    slots = table[request_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    invariant = None
    if invariant_last:
        invariant = np.zeros(len(specs), bool)
        invariant[-invariant_last:] = True

    def dev(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).to(DEVICE)

    return StepInputs(len(specs), int(qsl[-1]), block_size, dev(qsl, torch.int32), qsl, dev(seq_lens, torch.int32),
                      seq_lens, computed, dev(positions, torch.int64), dev(slots, torch.int64),
                      dev(table, torch.int32), invariant)


def random_caches(num_kv_heads: int, num_blocks: int, block_size: int, head_dim: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    return [torch.randn(shape, generator=g).to(dtype).to(DEVICE) for _ in range(2)]


def both_backends(triton_kernels, inputs: StepInputs, heads: int, kv_heads: int, head_dim: int,
                  dtype: torch.dtype, num_blocks: int, seed: int, num_programs_wanted: int = 64):
    """(torch backend's output and caches, triton backend's) after one layer's forward; the torch
    backend runs in float32 on the same values (its own 16-bit roundings are not the reference),
    its caches come back in `dtype`."""
    from engine.attention.triton_paged import TritonPagedBackend

    g = torch.Generator().manual_seed(seed + 1)
    n = inputs.num_tokens
    q = torch.randn(n, heads, head_dim, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(n, kv_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(n, kv_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    scale = head_dim ** -0.5
    results = []
    for backend, compute in ((TorchPagedBackend(heads, kv_heads, head_dim, inputs.block_size), torch.float32),
                             (TritonPagedBackend(heads, kv_heads, head_dim, inputs.block_size, num_programs_wanted),
                              dtype)):
        caches = [c.to(compute) for c in random_caches(kv_heads, num_blocks, inputs.block_size, head_dim, dtype, seed)]
        meta = backend.build_metadata(inputs)
        out = backend.forward(q.to(compute), k.to(compute), v.to(compute), (caches[0], caches[1]), meta, scale)
        results.append((out, [c.to(dtype) for c in caches], meta))
    return results


SHAPES = [(9, 3, 64), (4, 4, 32), (8, 2, 128), (4, 1, 64)]  # (heads, kv_heads, head_dim): GQA 3, 1, 4, MQA


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"h{s[0]}-kv{s[1]}-d{s[2]}")
def test_mixed_batch_matches_torch_backend(triton_kernels, dtype, shape):
    """Decodes of 1..700 keys (several splits), a chunk after a cached prefix, a whole prompt."""
    heads, kv_heads, head_dim = shape
    block_size, num_blocks = 16, 160
    specs = [(0, 1), (16, 1), (99, 1), (700, 1), (37, 45), (0, 70)]
    inputs = make_step(specs, block_size, num_blocks, seed=heads + head_dim)
    (ref, ref_caches, _), (out, caches, meta) = both_backends(triton_kernels, inputs, heads, kv_heads, head_dim,
                                                             dtype, num_blocks, seed=3)
    assert meta.num_decodes == 4 and meta.num_splits == 3  # 700 keys: three splits of at least 256
    assert torch.equal(ref_caches[0], caches[0]) and torch.equal(ref_caches[1], caches[1])
    assert (out.float() - ref.float()).abs().max().item() < TOLERANCE[dtype]


@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_splits_and_block_sizes(triton_kernels, block_size):
    """The same decode batch with 1 to 8 splits: every split count gives the torch backend's rows."""
    from engine.attention.triton_paged import TritonPagedBackend

    heads, kv_heads, head_dim, num_blocks = 6, 2, 64, 160
    inputs = make_step([(n - 1, 1) for n in (1, 2, 255, 256, 257, 1000)], block_size, num_blocks, seed=block_size)
    (ref, _, _), _ = both_backends(triton_kernels, inputs, heads, kv_heads, head_dim, torch.float32, num_blocks, 5)
    g = torch.Generator().manual_seed(6)  # both_backends' q (same seed), to rerun the kernel alone
    q = torch.randn(inputs.num_tokens, heads, head_dim, generator=g).to(DEVICE)
    caches = random_caches(kv_heads, num_blocks, block_size, head_dim, torch.float32, 5)
    k = torch.randn(inputs.num_tokens, kv_heads, head_dim, generator=g).to(DEVICE)
    v = torch.randn(inputs.num_tokens, kv_heads, head_dim, generator=g).to(DEVICE)
    triton_kernels.store_kv(k, v, caches[0], caches[1], inputs.slot_mapping)
    backend = TritonPagedBackend(heads, kv_heads, head_dim, block_size, 1)
    for splits in (1, 2, 5, 8):
        out = torch.empty_like(q)
        triton_kernels.decode_attention(q, caches[0], caches[1], inputs.block_table, inputs.seq_lens,
                                        head_dim ** -0.5, splits, out, block_n=16)
        assert (out - ref).abs().max().item() < 1e-5, f"{splits} splits"
    assert backend.build_metadata(inputs).num_splits == 1  # one program wanted: no split


def test_padded_decode_rows_and_graph_metadata(triton_kernels):
    """A captured batch's shape: block tables at full width, the splits for the longest possible
    sequence, padded rows with slot -1 writing nothing; the real rows equal the plain step's."""
    from engine.attention.triton_paged import TritonPagedBackend

    heads, kv_heads, head_dim, block_size, num_blocks = 4, 2, 64, 16, 64
    inputs = make_step([(30, 1), (300, 1), (5, 1)], block_size, num_blocks, seed=11)
    (ref, ref_caches, _), _ = both_backends(triton_kernels, inputs, heads, kv_heads, head_dim, torch.float32,
                                            num_blocks, 7)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(3, heads, head_dim, generator=g).to(DEVICE)
    k = torch.randn(3, kv_heads, head_dim, generator=g).to(DEVICE)
    v = torch.randn(3, kv_heads, head_dim, generator=g).to(DEVICE)
    size, full_width = 4, 40  # padded to 4 rows, 640 keys of block table
    tables = torch.full((size, full_width), int(inputs.block_table[0, 0]), dtype=torch.int32, device=DEVICE)
    tables[:3, : inputs.block_table.shape[1]] = inputs.block_table
    seq_lens = torch.ones(size, dtype=torch.int32, device=DEVICE)
    seq_lens[:3] = inputs.seq_lens
    slots = torch.full((size,), -1, dtype=torch.int64, device=DEVICE)
    slots[:3] = inputs.slot_mapping
    pad = lambda x: torch.cat([x, torch.zeros_like(x[:1])])  # noqa: E731
    backend = TritonPagedBackend(heads, kv_heads, head_dim, block_size, 64)
    meta = backend.decode_metadata(slots, tables, seq_lens)
    assert meta.num_splits == 3  # sized for 640 keys, whatever the lengths now
    caches = random_caches(kv_heads, num_blocks, block_size, head_dim, torch.float32, 7)
    out = backend.forward(pad(q), pad(k), pad(v), (caches[0], caches[1]), meta, head_dim ** -0.5)
    assert torch.equal(caches[0], ref_caches[0]) and torch.equal(caches[1], ref_caches[1])  # the pad wrote nothing
    assert (out[:3] - ref).abs().max().item() < 1e-5


def test_batch_invariant_tail_keeps_torch_attention(triton_kernels):
    """The batch-invariant requests (last) go through the torch backend's fixed-split attention:
    bitwise its rows; the others through the kernels."""
    heads, kv_heads, head_dim, block_size, num_blocks = 4, 2, 32, 16, 64
    inputs = make_step([(20, 1), (50, 1), (10, 12), (33, 1), (0, 9)], block_size, num_blocks, seed=4,
                       invariant_last=2)
    (ref, _, _), (out, _, meta) = both_backends(triton_kernels, inputs, heads, kv_heads, head_dim, torch.float32,
                                                num_blocks, 9)
    assert meta.invariant is not None and meta.invariant.row_start == 14
    assert torch.equal(out[14:], ref[14:])
    assert (out - ref).abs().max().item() < 1e-5


def test_engine_on_triton_backend_matches_transformers(triton_kernels, tiny_llama_dir, monkeypatch):
    """A tiny Llama on the triton-paged backend: a decode batched with other decodes and a
    prefill chunk after a cached prefix, logits within 1e-4 of transformers' at every position."""
    monkeypatch.setenv("TRITON_INTERPRET", "1" if DEVICE.type == "cpu" else "0")
    engine = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device=TEST_DEVICE,
                                    kv_cache_memory=8 << 20, max_model_len=256, block_size=4,
                                    attention_backend="triton-paged"))
    assert engine.runner.backend.name == "triton-paged"
    g = torch.Generator().manual_seed(3)
    a_ids = torch.randint(3, 256, (20,), generator=g).tolist()
    b_ids = torch.randint(3, 256, (26,), generator=g).tolist()
    ref_a, ref_b = hf_logits(tiny_llama_dir, a_ids), hf_logits(tiny_llama_dir, b_ids)
    a, b = new_request("a", a_ids[:12]), new_request("b", b_ids)
    a.token_ids = list(a_ids)  # fed one by one as if sampled
    (first,) = run_rows(engine, [(a, 12)])
    assert (first.cpu() - ref_a[:12]).abs().max().item() < 1e-4
    b_rows = []
    for step in range(12, 20):
        entries = [(a, 1)]
        if step in (13, 15):  # b's prompt in two chunks, the second after its cached first
            entries.append((b, 13))
        rows = run_rows(engine, entries)
        assert (rows[0][0].cpu() - ref_a[step]).abs().max().item() < 1e-4, f"position {step}"
        b_rows.extend(rows[1:])
    assert (torch.cat(b_rows).cpu() - ref_b).abs().max().item() < 1e-4


def test_triton_backend_on_cpu_needs_the_interpreter(tiny_llama_dir, monkeypatch):
    if DEVICE.type != "cpu":
        pytest.skip("a CPU-only check")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="triton-paged needs a CUDA device"):
        LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device="cpu", kv_cache_memory=8 << 20,
                               max_model_len=256, attention_backend="triton-paged"))
