"""n > 1: one engine request per choice. The engine itself runs single sequences."""
from __future__ import annotations

import msgspec

from common.messages import SamplingParams


def child_request_id(request_id: str, index: int) -> str:
    return f"{index}:{request_id}"


def fan_out(request_id: str, params: SamplingParams, first_index: int = 0) -> list[tuple[str, SamplingParams]]:
    """Child ids and params for each of the n choices; a seeded request gives choice i seed + i,
    so the choices differ from each other but the whole request stays reproducible.

    Choices are numbered from `first_index`: a request with several prompts numbers the
    choices of prompt p from p * n, so every child id of the request is distinct.
    """
    children = []
    for i in range(params.n):
        seed = None if params.seed is None else params.seed + i
        if seed is not None and seed >= 2**64:  # wrap as the engine's generator does (seed % 2**64), so it
            seed -= 2**64                       # still fits the wire's 64-bit integers
        children.append((child_request_id(request_id, first_index + i),
                         msgspec.structs.replace(params, n=1, seed=seed)))
    return children
