"""A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) checked against a base model.

Torch-free, so the server can refuse a folder that does not fit before anything reaches the engine,
and the engine reads the same verdict before it loads the tensors. The model's shapes come from its
config.json. A folder fits when every tensor is a lora_A / lora_B of one of the attention and MLP
projections (q/k/v/o, gate/up/down) of an existing layer, with the projection's own in/out size,
one rank per module no larger than `max_rank`, and none of the features we do not run (DoRA, bias,
modules_to_save, embedding or LM-head adapters). Each refusal names what does not fit.

The scaling is peft's: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, where r and alpha
may come from rank_pattern / alpha_pattern (matched as peft's get_pattern_key matches them).
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
MODULES = ATTENTION_MODULES + MLP_MODULES
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (peft's saved names)
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_MAX_HEADER = 100 << 20  # a safetensors header larger than this is not an adapter's


class LoraFolderError(ValueError):
    """The folder cannot serve as an adapter of this model; the message says what does not fit."""


@dataclass(frozen=True)
class ModuleLora:
    rank: int
    scaling: float
    a_key: str  # tensor names in the safetensors file
    b_key: str


@dataclass
class LoraFolder:
    path: Path
    modules: dict[tuple[int, str], ModuleLora] = field(default_factory=dict)  # (layer, module name) -> its LoRA

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules.values())


def model_shapes(model_config: dict) -> tuple[int, dict[str, tuple[int, int]]]:
    """(num_layers, module -> (in, out)) of a Llama / Qwen3 config.json."""
    hidden = int(model_config["hidden_size"])
    heads = int(model_config["num_attention_heads"])
    kv_heads = int(model_config.get("num_key_value_heads") or heads)
    head_dim = int(model_config.get("head_dim") or hidden // heads)
    inter = int(model_config["intermediate_size"])
    return int(model_config["num_hidden_layers"]), {
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def read_model_config(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors' names -> {"dtype", "shape", "data_offsets"}, from the file's JSON header."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise LoraFolderError(f"{path}: not a safetensors file (shorter than its header size)")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER:
            raise LoraFolderError(f"{path}: not a safetensors file (header of {size} bytes)")
        try:
            header = json.loads(f.read(size))
        except ValueError as e:
            raise LoraFolderError(f"{path}: not a safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise LoraFolderError(f"{path}: not a safetensors file")
    header.pop("__metadata__", None)
    return header


def _pattern_value(patterns: dict, module_name: str, default: float) -> float:
    for key, value in patterns.items():  # peft's get_pattern_key: the first key that ends the name
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default


def read_lora_folder(path: str | Path, model_config: dict, max_rank: int) -> LoraFolder:
    """The folder's modules with their ranks and scalings, or LoraFolderError naming what does not fit."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise LoraFolderError(f"{folder}: no such folder")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise LoraFolderError(f"{folder}: no {name} (a PEFT LoRA folder has {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except ValueError as e:
        raise LoraFolderError(f"{folder / CONFIG_FILE}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise LoraFolderError(f"{folder / CONFIG_FILE}: not a JSON object")
    _check_config(config)
    num_layers, shapes = model_shapes(model_config)
    header = safetensors_header(folder / WEIGHTS_FILE)
    pairs: dict[tuple[int, str], dict[str, tuple[str, list[int]]]] = {}
    for key, info in header.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraFolderError(f"tensor {key}: not a lora_A / lora_B of an attention or MLP projection "
                                  f"({', '.join(MODULES)}); embedding, LM-head and bias adapters are not served")
        layer, module, which = int(m.group(1)), m.group(3), m.group(4)
        if module not in MODULES:
            raise LoraFolderError(f"tensor {key}: module {module} is not one of {', '.join(MODULES)}")
        if layer >= num_layers:
            raise LoraFolderError(f"tensor {key}: layer {layer}, the model has {num_layers} layers")
        pairs.setdefault((layer, module), {})[which] = (key, list(info.get("shape", [])))
    if not pairs:
        raise LoraFolderError(f"{folder / WEIGHTS_FILE}: no LoRA tensors")
    alpha, alpha_pattern = float(config.get("lora_alpha", 8)), config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora", False))
    out = LoraFolder(folder)
    for (layer, module), ab in sorted(pairs.items()):
        if "A" not in ab or "B" not in ab:
            missing = "lora_A" if "A" not in ab else "lora_B"
            raise LoraFolderError(f"layer {layer} {module}: {missing} is missing")
        (a_key, a_shape), (b_key, b_shape) = ab["A"], ab["B"]
        fan_in, fan_out = shapes[module]
        if len(a_shape) != 2 or a_shape[1] != fan_in:
            raise LoraFolderError(f"tensor {a_key}: shape {a_shape}, the model's {module} takes {fan_in} inputs "
                                  f"(expected [r, {fan_in}])")
        rank = a_shape[0]
        if b_shape != [fan_out, rank]:
            raise LoraFolderError(f"tensor {b_key}: shape {b_shape}, expected [{fan_out}, {rank}] (the model's "
                                  f"{module} has {fan_out} outputs; rank {rank} from lora_A)")
        if rank < 1 or rank > max_rank:
            raise LoraFolderError(f"layer {layer} {module}: rank {rank} is over --max-lora-rank {max_rank}"
                                  if rank > max_rank else f"layer {layer} {module}: rank {rank}")
        module_alpha = float(_pattern_value(alpha_pattern, f"model.layers.{layer}.{_parent(module)}.{module}", alpha))
        scaling = module_alpha / math.sqrt(rank) if rslora else module_alpha / rank
        out.modules[(layer, module)] = ModuleLora(rank, scaling, a_key, b_key)
    return out


def _parent(module: str) -> str:
    return "self_attn" if module in ATTENTION_MODULES else "mlp"


def _check_config(config: dict) -> None:
    def refuse(what: str) -> LoraFolderError:
        return LoraFolderError(f"{CONFIG_FILE}: {what}")

    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise refuse(f"peft_type {peft_type!r}, only LORA adapters are served")
    if config.get("use_dora"):
        raise refuse("use_dora: DoRA adapters are not served")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise refuse(f"bias {config.get('bias')!r}: adapters that train biases are not served")
    if config.get("modules_to_save"):
        raise refuse(f"modules_to_save {config['modules_to_save']}: full-module copies are not served")
    if config.get("fan_in_fan_out"):
        raise refuse("fan_in_fan_out: the projections are nn.Linear, their weights are not transposed")
    for name in ("r", "lora_alpha"):
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            raise refuse(f"{name} {value!r} is not a positive number")
