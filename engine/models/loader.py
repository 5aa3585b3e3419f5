"""Load a Hugging Face folder (config.json + *.safetensors) into our model classes.

Checkpoint names map onto ours by dropping the `model.` prefix; a module the model lists in
`packed_modules_mapping` (q/k/v, gate/up) is loaded through its merged layer's `weight_loader`
into its slice, so the merged projections are built while loading, never as a second copy. Every
parameter (and every shard of a merged one) must be filled, and every checkpoint tensor must land
somewhere. Then each linear layer's method reworks its weight once (packing, for example).
`random_weights=True` fills the parameters from a seeded generator instead, from config.json
alone (an architecture's shapes and speed without its checkpoint, vLLM's `--load-format dummy`).
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.models.config import ModelArch, read_hf_config
from engine.models.layers import RotaryEmbedding
from engine.models.linear import Linear, LinearMethod, MergedLinear
from engine.models.llama import CausalLM


def load_model(model_dir: Path | str, dtype: torch.dtype, device: torch.device, method: LinearMethod,
               random_weights: bool = False) -> CausalLM:
    arch = ModelArch.from_hf_config(read_hf_config(model_dir))
    with torch.device("meta"):
        model = CausalLM(arch, method)
    # Materialise on the target device, then fill from the checkpoint.
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()  # to_empty gives each module its own tensor, breaking the tie
    _rebuild_rotary(model, device)  # its non-persistent cos/sin tables were left empty by meta
    if random_weights:
        fill_random_weights(model)
    else:
        _load_checkpoint(model, model_dir)
    for module in model.modules():
        if isinstance(module, Linear):
            module.process_weights_after_loading()
    return model.eval()


def fill_random_weights(model: CausalLM, seed: int = 0, std: float = 0.02) -> None:
    """Matrices (and the embedding) from N(0, std), as transformers initialises them; norm
    weights 1, biases 0. Seeded, so two engines on the same config hold the same weights."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied LM head is the embedding, listed once
            if param.dim() >= 2:
                param.normal_(0.0, std, generator=generator)
            else:
                param.fill_(0.0 if name.endswith("bias") else 1.0)


def _load_checkpoint(model: CausalLM, model_dir: Path | str) -> None:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[tuple[str, str | int | None]] = set()
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                target = _our_name(model, name)
                if target is not None:
                    _load(model, params, *target, f.get_tensor(name))
                    loaded.add(target)
    _check_complete(model, params, loaded, model_dir)


def _our_name(model: CausalLM, name: str) -> tuple[str, str | int | None] | None:
    """Checkpoint tensor name -> (our parameter name, shard id), or None for tensors we derive."""
    ours = name.removeprefix("model.")
    if "rotary_emb" in ours:
        return None  # RoPE tables are computed, not loaded
    if ours == "lm_head.weight" and model.arch.tie_word_embeddings:
        return None  # tied: the embedding fills it
    for checkpoint_module, (merged, shard_id) in model.packed_modules_mapping.items():
        if f".{checkpoint_module}." in ours:
            return ours.replace(f".{checkpoint_module}.", f".{merged}."), shard_id
    return ours, None


def _load(model: CausalLM, params: dict[str, nn.Parameter], name: str, shard_id: str | int | None,
          tensor: torch.Tensor) -> None:
    if name not in params:
        raise KeyError(f"unexpected checkpoint tensor for {name!r}")
    module = model.get_submodule(name.rpartition(".")[0])
    with torch.no_grad():
        if isinstance(module, Linear):
            module.weight_loader(params[name], tensor, shard_id)
        else:
            assert shard_id is None
            params[name].copy_(tensor)


def _check_complete(model: CausalLM, params: dict[str, nn.Parameter], loaded: set, model_dir: Path | str) -> None:
    if model.arch.tie_word_embeddings:
        loaded.add(("lm_head.weight", None))
    elif ("lm_head.weight", None) not in loaded and ("embed_tokens.weight", None) in loaded:
        # Some checkpoints tie without saying so: share the embedding rather than leave garbage.
        model.lm_head.weight = model.embed_tokens.weight
        loaded.add(("lm_head.weight", None))
    missing = []
    for name in params:
        module = model.get_submodule(name.rpartition(".")[0])
        shards = module.shard_offsets if isinstance(module, MergedLinear) else {None: None}
        missing += [f"{name}[{s}]" if s is not None else name for s in shards if (name, s) not in loaded]
    assert not missing, f"checkpoint {model_dir} lacks weights: {sorted(missing)[:8]}"


def _rebuild_rotary(model: CausalLM, device: torch.device) -> None:
    arch = model.arch
    model.rotary = RotaryEmbedding(arch.head_dim, arch.max_position_embeddings, arch.rope_theta,
                                   arch.rope_scaling).to(device)
