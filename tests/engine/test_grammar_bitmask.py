"""The CPU bitmask application against xgrammar's own kernel (the reference): random masks,
the sparse and full masks grammars produce, a vocabulary that is not a multiple of 32, and
constrained rows that are not the leading ones of the step."""
from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from engine.structured.bitmask import apply_bitmask, apply_grammar_bitmask
from engine.structured.manager import GrammarBitmask


def reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    xgr.apply_token_bitmask_inplace(out, bitmask, vocab_size=min(out.shape[-1], bitmask.shape[-1] * 32),
                                    backend="cpu")
    return out


@pytest.mark.parametrize("vocab", [49152, 1000, 31])
@pytest.mark.parametrize("kind", ["random", "sparse", "full", "none"])
def test_equals_xgrammar(vocab, kind):
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    if kind == "random":
        bitmask = torch.randint(-2**31, 2**31 - 1, (5, words), dtype=torch.int32, generator=g)
    else:
        bitmask = torch.full((5, words), {"sparse": 0, "full": -1, "none": 0}[kind], dtype=torch.int32)
        if kind == "sparse":
            bitmask[:, 0] = 0b1011
            bitmask[2, -1] = -(2**31)  # the highest bit of the last word
    logits = torch.randn(5, vocab, generator=g)
    want = reference(logits, bitmask)
    apply_bitmask(logits, bitmask)
    assert torch.equal(logits, want)


def test_rows_in_any_order():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 64, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (2, 2), dtype=torch.int32, generator=g)
    want = logits.clone()
    want[4], want[1] = reference(logits[[4, 1]], bitmask)
    apply_grammar_bitmask(logits, GrammarBitmask(["a", "b"], bitmask), {"a": 4, "b": 1, "c": 0})
    assert torch.equal(logits, want)
