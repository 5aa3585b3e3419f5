"""Load a Hugging Face folder (config.json + *.safetensors) into our model classes.

Checkpoint names map onto ours; q/k/v land in slices of `qkv_proj` and gate/up in slices of
`gate_up_proj`, so the merged projections are built while loading, never as a second copy.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.layers import RotaryEmbedding
from engine.models.llama import CausalLM, ModelArch

# checkpoint suffix -> (our suffix, shard index in the merged matrix or None)
_MERGED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def read_hf_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def load_model(model_dir: Path, dtype: torch.dtype, device: torch.device) -> CausalLM:
    arch = ModelArch.from_hf_config(read_hf_config(model_dir))
    with torch.device("meta"):
        model = CausalLM(arch)
    # Materialise on the target device, then fill from the checkpoint.
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()  # to_empty gives each module its own tensor, breaking the tie
    _rebuild_rotary(model, device)  # its non-persistent cos/sin tables were left empty by meta
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                _load_tensor(model, params, arch, name, f.get_tensor(name), loaded)
    if arch.tie_word_embeddings:
        loaded.add("lm_head.weight")
    elif "lm_head.weight" not in loaded and "embed_tokens.weight" in loaded:
        # Some checkpoints tie without saying so: share the embedding rather than leave garbage.
        model.lm_head.weight = model.embed_tokens.weight
        loaded.add("lm_head.weight")
    missing = set(params) - loaded
    assert not missing, f"checkpoint {model_dir} lacks weights: {sorted(missing)[:8]}"
    return model.eval()


def _rebuild_rotary(model: CausalLM, device: torch.device) -> None:
    arch = model.arch
    model.rotary = RotaryEmbedding(arch.head_dim, arch.max_position_embeddings, arch.rope_theta,
                                   arch.rope_scaling).to(device)


def _load_tensor(model, params, arch: ModelArch, name: str, tensor: torch.Tensor, loaded: set[str]) -> None:
    if name.startswith("model."):
        m = _LAYER_RE.match(name)
        if m is None:
            ours = name[len("model."):]
        else:
            layer, suffix, kind = m.groups()
            if suffix in _MERGED:
                target, shard = _MERGED[suffix]
                ours = f"layers.{layer}.{target}.{kind}"
                _copy_shard(params[ours], tensor, arch, target, shard)
                loaded.add(ours)
                return
            ours = f"layers.{layer}.{suffix}.{kind}"
    else:
        ours = name
    if ours == "lm_head.weight" and arch.tie_word_embeddings:
        return  # tied: the embedding already fills it
    if ours not in params:
        if "rotary_emb" in name:
            return
        raise KeyError(f"unexpected checkpoint tensor {name!r}")
    with torch.no_grad():
        params[ours].copy_(tensor)
    loaded.add(ours)


def _copy_shard(param: torch.Tensor, tensor: torch.Tensor, arch: ModelArch, target: str, shard: int) -> None:
    if target.endswith("qkv_proj"):
        q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        start, size = [(0, q), (q, kv), (q + kv, kv)][shard]
    else:
        size = arch.intermediate_size
        start = shard * size
    with torch.no_grad():
        param[start:start + size].copy_(tensor)
