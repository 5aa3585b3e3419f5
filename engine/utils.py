"""Small arithmetic shared across the engine."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks for `a` tokens of blocks of `b`."""
    return -(-a // b)
