"""A GGUF file's block-quantized matrices as codes, exactly as the file stores them.

The default model ships as a Q4_1 GGUF (layer matrices: 4-bit codes with a float16 scale and
minimum per group of 32 inputs; the tied embedding: Q8_0, 8-bit codes with one float16 scale per
32). `read_group_codes` splits each file block into three tensors a kernel reads directly (codes,
scales, mins; see `engine/native/csrc/quant_linear.cpp`), under our checkpoint names, so the
weights a step reads are the shipped ones at a third of bf16's bytes rather than floats inflated
from them. Nothing is rounded: `dequantize()` gives the same float32 weights transformers'
GGUF loader writes into the converted folder (a test compares them).

llama.cpp's converter permutes the rows of q and k (RoPE's halves interleaved, per head); the
rows are put back here. A row permutation moves whole groups, so the codes stay exact.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.default_model import default_model_dir, find_gguf
from common.engine_config import EngineConfig
from engine.models.gguf_index import Q4_1, Q8_0, TYPE_BLOCKS, read_tensors

GROUP = 32
PANEL = 8  # output rows the native kernel reads as one stream
# bytes per block of 32: Q4_1 d, m (float16) and 16 bytes of nibbles; Q8_0 d and 32 int8
_BLOCK_BYTES = {kind: TYPE_BLOCKS[kind][1] for kind in (Q4_1, Q8_0)}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class GroupCodes:
    """One [out, in] matrix in groups of 32 inputs. q4_1: w = scale * q + min, q in 0..15, codes
    uint8 [out, in / 2] (a group's 16 bytes: elements 0..15 in the low nibbles, 16..31 in the high);
    q8_0: w = scale * q, codes int8 [out, in]. scales, mins: float16 [out, in / 32]."""

    format: str
    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * GROUP

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins) if t is not None)

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in], as ggml de-quantizes (d * q exact in float32, + m rounded once)."""
        out, _ = self.shape
        scales = self.scales.float().unsqueeze(-1)
        if self.format == "q8_0":
            return (scales * self.codes.view(out, -1, GROUP).float()).view(out, -1)
        return (scales * self._q4_values().float() + self.mins.float().unsqueeze(-1)).view(out, -1)  # type: ignore[union-attr]

    def _q4_values(self) -> torch.Tensor:
        """Q4_1's codes one per element, group by group: uint8 [out, in / 32, 32], each 0..15."""
        nibbles = self.codes.view(self.shape[0], -1, GROUP // 2)
        return torch.cat((nibbles & 0x0F, nibbles >> 4), dim=-1)

    def panels(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes, scales, mins) in the native kernel's layout (quant_linear.cpp): panels of 8 output
        rows in steps of 32 bytes per row ([out / 8, steps, 8, 32]; Q8_0: a row's group per step;
        Q4_1: two groups per step, each row pair's 64 bytes 32 words of four nibbles) and
        [out / 8, in / 32, 8]; an empty float16 tensor for Q8_0's mins."""
        out, inputs = self.shape
        assert self.panel_ready, f"{self.shape}: needs a multiple of {PANEL} outputs and an even number of groups"
        groups = inputs // GROUP

        def panel(t: torch.Tensor) -> torch.Tensor:
            return t.view(out // PANEL, PANEL, t.shape[1], -1).transpose(1, 2).contiguous()

        codes = panel(self.codes.view(out, groups, -1))
        if self.format == "q4_1":
            codes = self._q4_words()
        mins = torch.empty(0, dtype=torch.float16) if self.mins is None else panel(self.mins).squeeze(-1)
        return codes, panel(self.scales).squeeze(-1), mins

    def _q4_words(self) -> torch.Tensor:
        """Q4_1 codes as quant_linear.cpp's words, uint8 [out / 8, in / 64, 8, 32]: in step s, row
        pair (2h, 2h + 1)'s word w is row 2h + (w >> 1 & 1) at position e = 2 (w >> 2) + (w & 1), its
        nibbles group 2s's elements e and e + 16, then group 2s + 1's."""
        out, inputs = self.shape
        # [panel, pair h, row in pair, step, group in step, half, e] -> nibble index 2 * group + half
        q = self._q4_values().view(out // PANEL, PANEL // 2, 2, inputs // 64, 2, 2, 16).to(torch.int32)
        words = q[..., 0, 0, :] | (q[..., 0, 1, :] << 4) | (q[..., 1, 0, :] << 8) | (q[..., 1, 1, :] << 12)
        # [panel, h, row, step, e] -> [panel, step, h, e // 2, row, e % 2]
        words = words.view(out // PANEL, PANEL // 2, 2, inputs // 64, 8, 2).permute(0, 3, 1, 4, 2, 5)
        words = words.reshape(out // PANEL, inputs // 64, PANEL // 2, 32).to(torch.int16).contiguous()
        return words.view(torch.uint8).view(out // PANEL, inputs // 64, PANEL, 32)

    def int8_tiles(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q4_1 (codes, scales, mins) in q4_int8_linear.cpp's layout: tiles of 16 outputs by one
        group, four vectors of 64 bytes ([out / 16, in / 32, 4, 64]: byte b of vector t holds output
        b / 4 at input 4t + b % 4 in its low nibble and at 4(t + 4) + b % 4 in its high one), and
        float16 [out / 16, in / 32, 16]."""
        assert self.format == "q4_1" and self.int8_tiles_ready, f"{self.format} {self.shape}"
        out, inputs = self.shape
        groups = inputs // GROUP
        q = self._q4_values().view(out // 16, 16, groups, 8, 4).permute(0, 2, 3, 1, 4)  # [tile, g, quad, 16, 4]
        codes = (q[:, :, :4] | (q[:, :, 4:] << 4)).reshape(out // 16, groups, 4, 64).contiguous()

        assert self.mins is not None
        return codes, self._per_tile(self.scales), self._per_tile(self.mins)

    def amx_tiles(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes, scales, mins) in amx_linear.cpp's layout: per 16 outputs and group, a matrix-unit
        tile row per output, its 32 inputs in order (Q4_1: uint8 [out / 16, in / 32, 8, 32], byte k
        of block s output 2s's code for input k in its low nibble and output 2s + 1's in its high
        one; Q8_0: int8 [out / 16, in / 32, 16, 32]), and float16 [out / 16, in / 32, 16] (an empty
        mins for Q8_0)."""
        assert self.amx_tiles_ready, f"{self.shape}: needs a multiple of 32 outputs"
        out, inputs = self.shape
        groups = inputs // GROUP
        values = self._q4_values() if self.format == "q4_1" else self.codes.view(out, groups, GROUP)
        rows = values.view(out // 16, 16, groups, GROUP).transpose(1, 2)  # [tile, group, output, input]
        codes = rows[:, :, 0::2] | (rows[:, :, 1::2] << 4) if self.format == "q4_1" else rows
        mins = torch.empty(0, dtype=torch.float16) if self.mins is None else self._per_tile(self.mins)
        return codes.contiguous(), self._per_tile(self.scales), mins

    def _per_tile(self, t: torch.Tensor) -> torch.Tensor:
        """float16 [out, groups] -> [out / 16, groups, 16]"""
        out, groups = t.shape
        return t.view(out // 16, 16, groups).transpose(1, 2).contiguous()

    @property
    def amx_tiles_ready(self) -> bool:
        return self.shape[0] % 32 == 0

    @property
    def int8_tiles_ready(self) -> bool:
        return self.format == "q4_1" and self.shape[0] % 16 == 0

    @property
    def panel_ready(self) -> bool:
        out, inputs = self.shape
        return out % PANEL == 0 and (self.format != "q4_1" or inputs % (2 * GROUP) == 0)

    def rows(self, index: torch.Tensor) -> GroupCodes:
        return GroupCodes(self.format, self.codes[index].contiguous(), self.scales[index].contiguous(),
                          None if self.mins is None else self.mins[index].contiguous())

    @staticmethod
    def stack(parts: list[GroupCodes]) -> GroupCodes:
        """Matrices of one format stacked along the output dimension (a merged projection)."""
        formats = {p.format for p in parts}
        assert len(formats) == 1, f"a merged layer mixes formats {sorted(formats)}"
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])  # type: ignore[misc]
        return GroupCodes(parts[0].format, torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                          mins)


def gguf_file(config: EngineConfig, model_dir: Path) -> Path | None:
    """The GGUF whose codes the engine runs on (--quantization), or None: dense weights."""
    if config.quantization in ("none", "int8") or config.load_format == "dummy":
        return None
    if config.model is None or Path(model_dir).resolve() == default_model_dir().resolve():
        return find_gguf()  # the default model (the server passes its converted folder by path)
    if config.quantization == "auto":
        return None  # a model folder keeps its checkpoint's dtype unless asked
    files = sorted(Path(model_dir).glob("*.gguf"))
    if not files:
        raise ValueError(f"--quantization gguf: no *.gguf file in {model_dir}")
    return files[0]


def read_group_codes(path: Path | str, num_heads: int, num_kv_heads: int) -> dict[str, GroupCodes]:
    """The Q4_1 / Q8_0 matrices of a llama-architecture GGUF under Hugging Face names
    (`model.layers.0.self_attn.q_proj.weight`, `model.embed_tokens.weight`, `lm_head.weight`).
    Tensors in other types (the float32 norms) are left to the converted folder."""
    found: dict[str, GroupCodes] = {}
    for tensor in read_tensors(path):
        kind = tensor.tensor_type
        if kind not in _BLOCK_BYTES:
            continue
        name = _hf_name(tensor.name)
        if name is None:
            raise ValueError(f"{path}: no Hugging Face name for the quantized tensor {tensor.name!r}")
        codes = _split_blocks(tensor.data, kind)
        heads = num_heads if name.endswith("q_proj.weight") else num_kv_heads if name.endswith("k_proj.weight") else 0
        if heads:
            codes = codes.rows(_unpermute_rope_rows(codes.shape[0], heads))
        found[name] = codes
    return found


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"


def _split_blocks(data: np.ndarray, kind: int) -> GroupCodes:
    """data: uint8 [out, groups * block_bytes], the file's blocks row by row."""
    out = data.shape[0]
    blocks = data.reshape(out, -1, _BLOCK_BYTES[kind])
    scales = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).reshape(out, -1))
    if kind == Q8_0:
        codes = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(out, -1))
        return GroupCodes("q8_0", codes, scales, None)
    mins = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).reshape(out, -1))
    codes = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 4:]).reshape(out, -1))
    return GroupCodes("q4_1", codes, scales, mins)


def _unpermute_rope_rows(rows: int, heads: int) -> torch.Tensor:
    """Index of GGUF rows in the checkpoint's order. llama.cpp stores a head's rows (half s of
    2, element j) at j * 2 + s; the checkpoint has them at s * half + j."""
    head_dim = rows // heads
    half = head_dim // 2
    original = torch.arange(rows)
    head, within = original // head_dim, original % head_dim
    return head * head_dim + (within % half) * 2 + within // half
