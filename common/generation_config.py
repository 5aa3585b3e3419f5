"""What a model folder says about generation: its EOS token ids and its sampling defaults.

Read once, by the engine, and sent to the other processes in EngineReady, so the server never
reads the model folder. EOS ids come from config.json and generation_config.json together
(either may name one id or a list). The sampling defaults are generation_config.json's values for
the fields a request may leave unset (temperature, top_p, top_k, min_p, repetition_penalty,
max_new_tokens -> max_tokens), which the server applies as `vllm serve` does by default.
Torch-free: plain JSON.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

logger = logging.getLogger(__name__)

# generation_config.json key -> SamplingParams field
_SAMPLING_DEFAULT_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                            "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def load_eos_token_ids(model_dir: str | Path) -> set[int]:
    """The ids that end a generation, from both files (a file may be missing)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        value = _read_json(Path(model_dir) / name).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


def load_generation_defaults(model_dir: str | Path) -> dict[str, int | float]:
    """SamplingParams field -> the model's default, for the finite numbers the file sets (maybe none)."""
    config = _read_json(Path(model_dir) / "generation_config.json")
    defaults: dict[str, int | float] = {}
    for key, field in _SAMPLING_DEFAULT_FIELDS.items():
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            defaults[field] = value
    if defaults:
        logger.info("sampling defaults from generation_config.json: %s", defaults)
    return defaults
