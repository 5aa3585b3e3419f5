"""n > 1 fan-out: distinct child ids, seed + i per choice, and seeds that stay on the wire."""
from __future__ import annotations

import msgspec

from common.messages import EngineRequest, SamplingParams, ToEngine
from common.parallel_sampling import fan_out


def test_children_get_distinct_ids_and_consecutive_seeds():
    children = fan_out("r", SamplingParams(n=3, seed=7), first_index=3)
    assert [cid for cid, _ in children] == ["3:r", "4:r", "5:r"]
    assert [p.seed for _, p in children] == [7, 8, 9] and all(p.n == 1 for _, p in children)


def test_the_largest_seed_wraps_and_still_encodes():
    """seed 2**64 - 1 with n=3: choices 1 and 2 wrap to 0 and 1 (the engine seeds its generator
    with seed % 2**64 anyway) instead of overflowing msgpack's 64-bit integers."""
    children = fan_out("r", SamplingParams(n=3, seed=2**64 - 1))
    assert [p.seed for _, p in children] == [2**64 - 1, 0, 1]
    for cid, p in children:
        wire = msgspec.msgpack.encode(EngineRequest(cid, [1, 2], p))
        assert msgspec.msgpack.Decoder(ToEngine).decode(wire).sampling_params.seed == p.seed
