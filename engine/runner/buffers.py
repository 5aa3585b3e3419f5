"""Host arrays with a device twin, for the inputs the runner writes on the host every step.

The host side is a numpy view (cheap writes and vectorised index arithmetic). On CUDA it lives in
pinned memory so the copy to the device is asynchronous (`non_blocking`); on CPU the device twin
*is* the host tensor, so nothing is copied at all.
"""
from __future__ import annotations

import numpy as np
import torch


class CpuGpuBuffer:
    def __init__(self, shape: tuple[int, ...] | int, dtype: torch.dtype, device: torch.device):
        on_cpu = device.type == "cpu"
        self.cpu = torch.zeros(shape, dtype=dtype, pin_memory=not on_cpu)
        self.np: np.ndarray = self.cpu.numpy()
        self.device_tensor = self.cpu if on_cpu else torch.zeros_like(self.cpu, device=device)

    def to_device(self, n: int | None = None, columns: int | None = None) -> torch.Tensor:
        """The first `n` entries (along dim 0), and of a 2-D buffer its first `columns`, on the
        device (the device tensor, of which only that part was copied)."""
        if self.device_tensor is self.cpu:
            return self.cpu if n is None else self.cpu[:n]
        rows = slice(None) if n is None else slice(n)
        cols = slice(None) if columns is None else slice(columns)
        index = (rows, cols) if columns is not None else (rows,)
        self.device_tensor[index].copy_(self.cpu[index], non_blocking=True)
        return self.device_tensor if n is None else self.device_tensor[:n]

    def stage(self, values: np.ndarray) -> torch.Tensor:
        """Copy `values` into the first len(values) entries and return them on the device."""
        n = len(values)
        self.np[:n] = values
        return self.to_device(n)
