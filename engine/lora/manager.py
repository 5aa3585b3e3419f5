"""Which adapters are resident, which are only in host memory, and each step's token groups.

Up to `max_loras` adapters sit in slots of every LoRA-carrying layer (engine/lora/slots.py); up
to `max_cpu_loras` loaded adapters stay in host memory (least recently used out first), so taking
an adapter back into a slot copies tensors instead of reading its folder again. A step needs at
most `max_loras` distinct adapters (the scheduler admits no more); `activate` puts them in slots,
evicting the least recently used adapter of no row of this step. Adapters are keyed by their
LoraRequest id: a reload of a name gets a new id, so nothing of the old weights is reused.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.lora_folder import LoraFolder, read_lora_folder
from common.messages import LoraRequest
from engine.lora.context import StepLora
from engine.lora.slots import LoraSlots

logger = logging.getLogger(__name__)

# checkpoint module -> (the layer attribute path under a decoder layer, its shard id in a merged layer)
MODULE_LAYERS: dict[str, tuple[str, str | int | None]] = {
    "q_proj": ("self_attn.qkv_proj", "q"), "k_proj": ("self_attn.qkv_proj", "k"),
    "v_proj": ("self_attn.qkv_proj", "v"), "o_proj": ("self_attn.o_proj", None),
    "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1), "down_proj": ("mlp.down_proj", None),
}


@dataclass
class LoadedLora:
    """An adapter in host memory: per (layer, module) its A [r, in] and scaled B [out, r]."""

    request: LoraRequest
    tensors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


class LoraManager:
    def __init__(self, model: torch.nn.Module, model_config: dict, max_loras: int, max_rank: int,
                 max_cpu_loras: int, dtype: torch.dtype, device: torch.device, native: Any = None):
        self.model_config = model_config
        self.max_loras, self.max_rank = max_loras, max_rank
        self.max_cpu_loras = max(max_cpu_loras, max_loras)
        self.dtype, self.device = dtype, device
        self.slots: dict[tuple[int, str], LoraSlots] = {}  # (layer, module) -> its layer's slots
        for layer_idx, layer in enumerate(model.layers):  # type: ignore[arg-type]
            by_path: dict[str, LoraSlots] = {}
            for module, (path, _shard) in MODULE_LAYERS.items():
                if path not in by_path:
                    linear = layer.get_submodule(path)
                    offsets = getattr(linear, "shard_offsets", None)
                    names = {s: m for m, (p, s) in MODULE_LAYERS.items() if p == path}
                    slices = ([(names[s], start, size) for s, (start, size) in offsets.items()] if offsets
                              else [(module, 0, linear.output_size)])
                    by_path[path] = LoraSlots(linear.input_size, slices, max_loras, max_rank, dtype, device)
                    by_path[path].native = native  # the native CPU kernels' delta, where they are on
                    linear.lora = by_path[path]
                self.slots[(layer_idx, module)] = by_path[path]
        self.folders: dict[int, LoraFolder] = {}  # id -> its checked folder (cheap: names and shapes)
        self.cpu: OrderedDict[int, LoadedLora] = OrderedDict()  # least recently used first
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # resident id -> slot, least recently used first
        self.free_slots = list(range(max_loras))

    def check(self, lora: LoraRequest) -> LoraFolder:
        """The adapter's folder, checked against the model (LoraFolderError naming what does not fit)."""
        folder = self.folders.get(lora.id)
        if folder is None:
            folder = read_lora_folder(lora.path, self.model_config, self.max_rank)
            self.folders[lora.id] = folder
        return folder

    def forget(self, lora_id: int) -> None:
        """Drop an adapter from host memory and its slot (no running request may use it)."""
        self.folders.pop(lora_id, None)
        self.cpu.pop(lora_id, None)
        slot = self.slot_of.pop(lora_id, None)
        if slot is not None:
            self.free_slots.append(slot)

    def _load(self, lora: LoraRequest) -> LoadedLora:
        loaded = self.cpu.get(lora.id)
        if loaded is not None:
            self.cpu.move_to_end(lora.id)
            return loaded
        from safetensors.torch import load_file

        folder = self.check(lora)
        raw = load_file(str(folder.path / "adapter_model.safetensors"))
        tensors = {}
        for key, module in folder.modules.items():
            a = raw[module.a_key].to(torch.float32)
            b = raw[module.b_key].to(torch.float32) * module.scaling  # scaled in float32, then rounded once
            tensors[key] = (a.to(self.dtype), b.to(self.dtype))
        loaded = LoadedLora(lora, tensors)
        self.cpu[lora.id] = loaded
        while len(self.cpu) > self.max_cpu_loras:
            old, _ = self.cpu.popitem(last=False)
            logger.info("LoRA adapter id %d out of host memory (least recently used)", old)
        logger.info("LoRA adapter %s (id %d) loaded from %s: %d modules, rank %d", lora.name, lora.id, lora.path,
                    len(tensors), folder.max_rank)
        return loaded

    def activate(self, loras: dict[int, LoraRequest]) -> dict[int, int]:
        """Make the step's adapters resident: id -> slot."""
        assert len(loras) <= self.max_loras, f"{len(loras)} adapters in one step, --max-loras {self.max_loras}"
        for lora_id, lora in loras.items():
            if lora_id in self.slot_of:
                self.slot_of.move_to_end(lora_id)
                continue
            loaded = self._load(lora)
            if not self.free_slots:
                victim = next(i for i in self.slot_of if i not in loras)
                self.free_slots.append(self.slot_of.pop(victim))
            slot = self.free_slots.pop()
            layers = {id(s): s for s in self.slots.values()}
            for layer_slots in layers.values():
                layer_slots.clear(slot)
            for (layer, module), (a, b) in loaded.tensors.items():
                self.slots[(layer, module)].set(slot, module, a, b)
            self.slot_of[lora_id] = slot
        return {lora_id: self.slot_of[lora_id] for lora_id in loras}

    def step_groups(self, token_lora_ids: np.ndarray, loras: dict[int, LoraRequest]) -> StepLora | None:
        """The step's slot groups from each flat-batch row's adapter id (0: the base model)."""
        if not loras:
            return None
        slots = self.activate(loras)
        groups: list[tuple[int, torch.Tensor | None]] = []
        token_slots = np.full(len(token_lora_ids), -1, np.int32)
        for lora_id, slot in slots.items():
            rows = np.flatnonzero(token_lora_ids == lora_id)
            token_slots[rows] = slot
            whole = len(rows) == len(token_lora_ids)
            groups.append((slot, None if whole else torch.from_numpy(rows).to(self.device)))
        return StepLora(groups, torch.from_numpy(token_slots).to(self.device))
