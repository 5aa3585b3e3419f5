"""Pick the device and dtype: the same code runs on CPU and CUDA."""
from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but CUDA is not available")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}: use cpu, cuda or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # bfloat16 on both: on CPUs with AVX512-BF16/AMX it halves the weight bytes read per
        # decode step and runs batched GEMMs faster (see the benchmark table in the README).
        return torch.bfloat16
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of {sorted(_DTYPES)} or auto")
    if name == "float16" and device.type == "cpu":
        raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
    return _DTYPES[name]
