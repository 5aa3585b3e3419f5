"""The LoRA delta on a GPU as punica's bgmv kernels in Triton: shrink, then expand, per token.

Each token carries its resident slot (-1: the base model). `shrink`: one program per (token, tile
of rank columns) computes t = x @ A[slot]^T over the input in tiles; `expand`: one program per
(token, tile of output columns) adds t @ B[slot]^T into the base output in place. A base token's
programs return at once (its t is zeros, its output untouched). Sums in float32, whatever the
tensors' dtype. On a CPU they run under Triton's interpreter (TRITON_INTERPRET=1), which is how
the tests check them against the torch path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slot_ptr, t_ptr, K, R, stride_x, stride_a_slot, stride_a_r, stride_t,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if slot >= 0:
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + tok * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + slot * stride_a_slot + r[:, None] * stride_a_r + k[None, :],
                        mask=(r[:, None] < R) & (k[None, :] < K), other=0.0).to(tl.float32)
            acc += tl.sum(a * x[None, :], axis=1)
    tl.store(t_ptr + tok * stride_t + r, acc, mask=r < R)


@triton.jit
def _expand_kernel(t_ptr, b_ptr, slot_ptr, out_ptr, N, R, stride_t, stride_b_slot, stride_b_n, stride_b_r, stride_out,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            t = tl.load(t_ptr + tok * stride_t + r, mask=r < R, other=0.0)
            b = tl.load(b_ptr + slot * stride_b_slot + n[:, None] * stride_b_n + r[None, :] * stride_b_r,
                        mask=(n[:, None] < N) & (r[None, :] < R), other=0.0).to(tl.float32)
            acc += tl.sum(b * t[None, :], axis=1)
        mask = n < N
        out = tl.load(out_ptr + tok * stride_out + n, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + tok * stride_out + n, (out + acc).to(out_ptr.dtype.element_ty), mask=mask)


def add_lora_delta(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   token_slots: torch.Tensor) -> None:
    """out[i] += (x[i] @ a[s]^T) @ b[s]^T for every token i of slot s = token_slots[i] >= 0, in place.
    x: [tokens, in]; out: [tokens, out]; a: [slots, R, in]; b: [slots, out, R] (any strides, as the
    transpose of the slots' [slots, R, out]); token_slots: [tokens] int."""
    num_tokens, k = x.shape
    r, n = a.shape[1], out.shape[1]
    assert x.stride(1) == 1 and out.stride(1) == 1 and a.stride(2) == 1
    t = torch.empty(num_tokens, r, dtype=torch.float32, device=x.device)
    block_r = triton.next_power_of_2(min(r, 64))
    _shrink_kernel[(num_tokens, triton.cdiv(r, block_r))](
        x, a, token_slots, t, k, r, x.stride(0), a.stride(0), a.stride(1), t.stride(0),
        BLOCK_R=block_r, BLOCK_K=64)
    _expand_kernel[(num_tokens, triton.cdiv(n, 64))](
        t, b, token_slots, out, n, r, t.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        BLOCK_N=64, BLOCK_R=block_r)
