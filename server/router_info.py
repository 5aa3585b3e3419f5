"""What a KV-aware router asks a replica it discovers: its cache identity and its KV event sources.

vllm-router's `kv_aware` policy, given replicas by Kubernetes service discovery (or by
`--worker-urls` without `--kv-event-source`), asks each one:

- `GET /get_server_info`: the served model, this process's instance id and the KV block size,
  which must match the block size its events use;
- `GET /kv_event_sources`: the KV event publishers by data-parallel rank (here one, rank "0"),
  each as `--kv-events-config` set it; an endpoint bound on `*` is reached at the replica's own
  host. `{}` when this replica publishes no events (the router then does not index it).

With both, the router subscribes to every replica's events by itself (docs/scale-out.md).
"""
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

router = APIRouter()

INSTANCE_ID = uuid.uuid4().hex  # new at every start: a router re-reads the sources of a restarted replica


@router.get("/get_server_info")
async def get_server_info(raw: Request) -> dict:
    state = raw.app.state.serving
    block_size = state.engine_config.block_size
    # the served name as the path too: this endpoint is open (as /metrics), the folder stays private
    return {"model_id": state.served_model_name, "model_path": state.served_model_name, "instance_id": INSTANCE_ID,
            "kv_block_size": block_size, "effective_attention_block_size": block_size}


@router.get("/kv_event_sources")
async def kv_event_sources(raw: Request) -> dict:
    config = raw.app.state.serving.engine_config.kv_events_config
    if config is None or not config.publishes or not raw.app.state.serving.engine_config.enable_prefix_caching:
        return {}
    return {"0": {"endpoint": config.endpoint, "replay_endpoint": config.replay_endpoint, "topic": config.topic,
                  "hwm": config.hwm, "buffer_steps": config.buffer_steps, "publisher": config.publisher,
                  "encoding": "msgpack", "schema_version": 1, "enable_kv_cache_events": True}}
