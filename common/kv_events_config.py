"""`--kv-events-config`, as in vLLM: where the engine publishes its KV cache events.

    --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                         "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": ""}'

The keys and defaults are vLLM's `KVEventsConfig`. A KV-aware router (vllm-router's `kv_aware`
policy, llm-d's endpoint picker, Dynamo) subscribes to the endpoint and learns which prompt
prefixes each replica holds (engine/kv_events, docs/scale-out.md).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

PUBLISHERS = ("zmq", "null")


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "zmq"  # "null": record nothing (as if disabled)
    endpoint: str = "tcp://*:5557"  # with "*" bound, else connected to
    replay_endpoint: str | None = None  # a ROUTER socket that resends buffered batches
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # batches waiting for the publishing thread; beyond it, dropped
    topic: str = ""

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse and check; ValueError names what is wrong."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kv events config is not valid JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("kv events config must be a JSON object")
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"kv events config: unknown keys {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError("kv events config: enable_kv_cache_events must be true or false")
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"kv events config: publisher {self.publisher!r} is not one of {PUBLISHERS}")
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"kv events config: {name} must be a string")
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"kv events config: endpoint {self.endpoint!r} is not a ZMQ address (tcp://, ipc://)")
        if self.replay_endpoint is not None and not isinstance(self.replay_endpoint, str):
            raise ValueError("kv events config: replay_endpoint must be a string")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"kv events config: {name} must be a positive integer, got {value!r}")


def parse_kv_events_config(text: str) -> KVEventsConfig | None:
    """The CLI's parser: '' or 'none' turns it off; a bad value is an argparse error with the reason."""
    if text.strip().lower() in ("", "none", "null"):
        return None
    try:
        return KVEventsConfig.from_json(text)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
