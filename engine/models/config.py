"""The architecture fields we read from a Hugging Face config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


def read_hf_config(model_dir: Path | str) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


@dataclass(frozen=True)
class ModelArch:
    """What our model classes need to know about a checkpoint."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelArch:
        model_type = cfg["model_type"]
        if model_type not in ("llama", "qwen3"):
            raise ValueError(f"unsupported model_type {model_type!r}: this engine runs llama and qwen3")
        rope = cfg.get("rope_parameters") or {}  # transformers >= 5 keeps theta and scaling here
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            qk_norm=model_type == "qwen3",
        )
