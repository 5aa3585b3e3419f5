"""LoRA adapters as served models: the names, /v1/load_lora_adapter and /v1/unload_lora_adapter.

An adapter is a name clients send as `model` and the PEFT folder behind it (`--lora-modules
name=path`, or vLLM's JSON form `{"name": .., "path": .., "base_model_name": ..}`). Each load
gets a new id, carried by the requests that use it (`SamplingParams.lora`): the engine reads the
folder the first time it sees the id and keys its weights and prefix-cache blocks by it, so an
adapter unloaded and loaded again (even from another folder) never reuses the old one's. A request
in flight keeps the adapter it started with whatever is unloaded meanwhile. The folder is checked
here against the model's config.json (common/lora_folder.py) before anything reaches the engine.
The two endpoints exist only with --allow-runtime-lora-updating (vLLM's rule: a 404 without it).
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from common.lora_folder import LoraFolderError, read_lora_folder, read_model_config
from common.messages import GenerateRequest, LoraRequest
from server.errors import ApiError, bad_request
from server.json_body import StrictJSONRoute


@dataclass(frozen=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoraModule:
    """`name=path`, or vLLM's JSON object with name, path and optionally base_model_name."""
    text = text.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ValueError(f"--lora-modules: not JSON ({e}): {text}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("path"), str):
            raise ValueError(f'--lora-modules: a JSON module needs "name" and "path" strings: {text}')
        unknown = set(obj) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"--lora-modules: unknown field(s) {', '.join(sorted(unknown))}: {text}")
        return LoraModule(obj["name"], obj["path"], obj.get("base_model_name"))
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules: expected name=path or a JSON object, got {text!r}")
    return LoraModule(name, path)


class LoraRegistry:
    """The adapters served now, by name, and the requests in flight on each (for the metric)."""

    def __init__(self, model_dir: str, max_rank: int, max_loras: int, base_names: tuple[str, ...]):
        self.model_config = read_model_config(model_dir)
        self.max_rank, self.max_loras = max_rank, max_loras
        self.base_names = base_names
        self.adapters: dict[str, LoraRequest] = {}
        self.parents: dict[str, str] = {}
        self._next_id = 1
        self.in_flight: Counter[str] = Counter()

    def add(self, name: str, path: str, parent: str | None = None) -> LoraRequest:
        """Check the folder against the model (LoraFolderError naming what does not fit) and serve it."""
        if name in self.adapters or name in self.base_names:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")
        read_lora_folder(path, self.model_config, self.max_rank)
        lora = LoraRequest(name, self._next_id, path)
        self._next_id += 1
        self.adapters[name] = lora
        self.parents[name] = parent or self.base_names[0]
        return lora

    def remove(self, name: str) -> None:
        del self.adapters[name]
        del self.parents[name]

    def with_lora(self, model: str | None, request: GenerateRequest) -> GenerateRequest:
        """The request with the adapter its `model` names (unchanged for the base model)."""
        lora = self.adapters.get(model) if model is not None else None
        if lora is None:
            return request
        params = msgspec.structs.replace(request.sampling_params, lora=lora)
        return msgspec.structs.replace(request, sampling_params=params)

    def info_labels(self) -> dict[str, str]:
        """vLLM's vllm:lora_requests_info labels: the adapters of the requests in flight."""
        running = ",".join(sorted(n for n, c in self.in_flight.items() if c > 0))
        return {"max_lora": str(self.max_loras), "running_lora_adapters": running, "waiting_lora_adapters": ""}


def lora_info_sample(registry: LoraRegistry) -> bytes:
    """The vllm:lora_requests_info gauge in Prometheus text (the time of the sample, as vLLM)."""
    labels = ",".join(f'{k}="{v}"' for k, v in registry.info_labels().items())
    return (b"# HELP vllm:lora_requests_info Running stats on lora requests.\n"
            b"# TYPE vllm:lora_requests_info gauge\n"
            + f"vllm:lora_requests_info{{{labels}}} {time.time()}\n".encode())


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str
    lora_int_id: int | None = None


router = APIRouter(route_class=StrictJSONRoute)


def _registry(raw: Request) -> LoraRegistry:
    registry = raw.app.state.serving.lora
    if registry is None:
        raise bad_request("LoRA adapters are off: start the server with --enable-lora", "lora_name")
    return registry


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapterRequest, raw: Request):
    registry = _registry(raw)
    if not body.lora_name or not body.lora_path:
        raise bad_request("Both 'lora_name' and 'lora_path' must be provided.", "lora_name")
    if body.load_inplace and body.lora_name in registry.adapters:
        registry.remove(body.lora_name)  # vLLM's load_inplace: the name now serves the new folder
    try:
        registry.add(body.lora_name, body.lora_path)
    except LoraFolderError as e:
        raise bad_request(f"lora_path: {e}", "lora_path") from None
    except ValueError as e:
        raise bad_request(str(e), "lora_name") from None
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, raw: Request):
    registry = _registry(raw)
    if body.lora_name not in registry.adapters:
        raise ApiError(404, f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name",
                       code="model_not_found")
    registry.remove(body.lora_name)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
