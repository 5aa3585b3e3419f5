"""A few well-known architectures by name, as the fields of their config.json, so the roofline can
be computed for a model that is not on this machine (`python -m engine.roofline llama3-8b`)."""
from __future__ import annotations

_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "num_key_value_heads": 8, "rope_theta": 500000.0,
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}

NAMED_CONFIGS: dict[str, dict] = {
    "llama3-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 8192},
    "llama3-70b": {**_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                   "num_attention_heads": 64, "max_position_embeddings": 8192},
    "llama3.2-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                    "num_attention_heads": 32, "head_dim": 64, "tie_word_embeddings": True},
    "qwen3-8b": {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "rope_theta": 1000000.0, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                 "tie_word_embeddings": False},
}
