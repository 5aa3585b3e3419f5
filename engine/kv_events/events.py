"""The events, as vLLM's `vllm.distributed.kv_events` defines them and vllm-router decodes them.

A batch is a msgpack array `[ts, events, data_parallel_rank]` (msgspec `array_like`); each event a
msgpack map tagged by its class name under "type" (`{"type": "BlockStored", "block_hashes": [...],
...}`), fields in vLLM's order, defaults after the required ones and omitted when unset. Hashes are
`engine.core.block_hash.external_hash` integers. The medium is "GPU", vLLM's name for the engine's
own KV cache (whatever the device: a router reads any other medium as an offload tier, credited less).
"""
from __future__ import annotations

from typing import Any

import msgspec

MEDIUM = "GPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the events; the tag is the class name, under "type"."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None  # one entry per block


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
