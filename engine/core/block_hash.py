"""The prefix-cache block hash: sha256 over (parent block's hash, the block's token ids, extra keys).

The same function as vLLM's `sha256` prefix-caching hash (`hash_block_tokens`): the pickled tuple,
hashed with SHA-256, and the first block's parent a fixed root (vLLM's NONE_HASH with
PYTHONHASHSEED=0). Python's `hash()` differs between processes (string hashing is salted per
interpreter), so two replicas, or a replica and a router, would never agree on it; this one is the
same on every process and machine, which is what lets a KV-aware router compute a prompt's block
hashes and look them up in the events a replica publishes (engine/kv_events).
"""
from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

PICKLE_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL of every Python this project runs on: fixed, so the bytes are


def sha256(value: object) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=PICKLE_PROTOCOL)).digest()


ROOT_HASH = sha256("0")  # the parent of a sequence's first block


def hash_block(parent: bytes | None, token_ids: Sequence[int], extra_keys: tuple | None = None) -> bytes:
    return sha256((ROOT_HASH if parent is None else parent, tuple(token_ids), extra_keys))


def external_hash(block_hash: bytes) -> int:
    """The hash as KV events carry it: its last 8 bytes as an unsigned integer (vLLM's default,
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
    return int.from_bytes(block_hash[-8:], "big")
