"""The tensors of a GGUF file (name, type, shape and where their bytes lie), read from its header
without decoding the metadata.

gguf's GGUFReader decodes every metadata value into numpy views, one at a time: the default
model's 49,152-entry token list alone takes it ~4 s, at every engine start. The engine needs
only the tensor index, so this walks the metadata's bytes (a string's length says how far to
skip) and maps the tensors' data from the file. Layout (GGUF v2 and v3, little-endian):

    magic "GGUF", version u32, tensor count u64, metadata count u64
    metadata: key (u64 length + UTF-8), value type u32, value (an array: element type u32,
              count u64, elements)
    tensor infos: name, dims u32, each dim u64 (innermost first), type u32, offset u64
    data: from the first multiple of `general.alignment` (32 if absent) after the infos; each
          tensor at its offset from there
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
_STRING, _ARRAY, _UINT32 = 8, 9, 4
# metadata value type -> its size in bytes (the fixed-size types)
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# GGML tensor type ids (ggml.h) of the two block formats the engine runs on
Q4_1, Q8_0 = 3, 8
# tensor type -> (elements per block, bytes per block) for the types this engine reads or skips:
# F32, F16, Q4_0, Q4_1, Q8_0, BF16
TYPE_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34), 30: (1, 2)}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: int  # GGML's type id (3 = Q4_1, 8 = Q8_0)
    shape: tuple[int, ...]  # outermost first, as numpy orders it (a matrix: [out, in])
    data: np.ndarray  # uint8 [rows..., bytes per row], a read-only view of the file


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("<Q")
        self.pos += length
        return bytes(self.buf[self.pos - length:self.pos]).decode("utf-8")

    def skip_value(self, kind: int) -> None:
        if kind in _SCALAR_BYTES:
            self.pos += _SCALAR_BYTES[kind]
        elif kind == _STRING:
            (length,) = self.unpack("<Q")
            self.pos += length
        elif kind == _ARRAY:
            element, count = self.unpack("<IQ")
            if element in _SCALAR_BYTES:
                self.pos += count * _SCALAR_BYTES[element]
            else:
                for _ in range(count):
                    self.skip_value(element)
        else:
            raise ValueError(f"unknown GGUF metadata type {kind} at byte {self.pos}")


def read_tensors(path: Path | str) -> list[GGUFTensor]:
    """The file's tensors in the order the file lists them; their data maps the file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(raw.data))
    magic = bytes(cur.buf[:4])
    cur.pos = 4
    if magic != _MAGIC:
        raise ValueError(f"{path}: not a GGUF file (magic {magic!r})")
    version, tensor_count, kv_count = cur.unpack("<IQQ")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} (this reader knows 2 and 3)")
    alignment = 32
    for _ in range(kv_count):
        key = cur.string()
        (kind,) = cur.unpack("<I")
        if key == "general.alignment" and kind == _UINT32:
            (alignment,) = cur.unpack("<I")
        else:
            cur.skip_value(kind)
    infos = []
    for _ in range(tensor_count):
        name = cur.string()
        (dims,) = cur.unpack("<I")
        ne = cur.unpack(f"<{dims}Q")
        tensor_type, offset = cur.unpack("<IQ")
        infos.append((name, tensor_type, tuple(reversed(ne)), offset))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, tensor_type, shape, offset in infos:
        if tensor_type not in TYPE_BLOCKS:
            raise ValueError(f"{path}: tensor {name!r} has GGML type {tensor_type}, which this reader does not know")
        per_block, block_bytes = TYPE_BLOCKS[tensor_type]
        row_bytes = shape[-1] // per_block * block_bytes
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        start = data_start + offset
        data = raw[start:start + rows * row_bytes].reshape(*shape[:-1], row_bytes)
        tensors.append(GGUFTensor(name, tensor_type, shape, data))
    return tensors
