"""LoRA adapters made with peft on a local model folder, saved as PEFT folders for the tests.

B is random and non-zero (peft's init_lora_weights=False), scaled so that an adapter changes the
greedy text without turning it into noise; each seed gives a different adapter.
"""
from __future__ import annotations

from pathlib import Path

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(model_dir: str | Path, out_dir: str | Path, seed: int, r: int = 8, alpha: float = 16,
                 target_modules: list[str] | None = None, use_rslora: bool = False, b_scale: float = 0.3,
                 **config) -> Path:
    """Save a peft LoRA adapter of the model in `out_dir` and return the folder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    lora_config = LoraConfig(r=r, lora_alpha=alpha, target_modules=target_modules or ALL_MODULES,
                             use_rslora=use_rslora, init_lora_weights=False, lora_dropout=0.0, **config)
    model = get_peft_model(base, lora_config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(b_scale)
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def peft_model(model_dir: str | Path, adapter_dir: str | Path):
    """transformers + peft with the adapter, float32, for reference outputs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).eval()
