"""FLOPs and bytes of one model step, per operator, from the architecture and the step's shapes.

A step is a list of sequences, each `(query_len, context_len)`: the tokens computed this step and
the tokens in its KV cache after the step (its own included). A decode row has query_len 1; a
prefill chunk has more. What each operator costs:

- the layer GEMMs, `[tokens, k] @ [k, n]` in every layer (qkv_proj, o_proj, gate_up_proj,
  down_proj): 2·tokens·k·n FLOPs; bytes = the weights once (their stored bytes per element) plus
  each token row's input and output activations.
- lm_head, `[sampled, hidden] @ [hidden, vocab]` once: only the rows that sample (one per
  sequence that reaches the end of its tokens; a partial prefill chunk samples none, a draft adds
  its rows). A tied head reads the embedding matrix: the same bytes.
- attention: QK^T and PV, 4·heads·head_dim FLOPs per (query row, key) pair, every query row
  attending causally to the keys up to its own position; bytes = the K and V of every context
  token crossing memory once: the cached ones read (the query heads of a GQA group share the
  read), the step's own written. That is the lower bound; a kernel that reads the step's own K/V
  back from the cache moves query_len tokens more.

Left out: norms, rotary embeddings, the MLP's activation, the embedding lookup and sampling, each
one activation row per token, small next to these.

Every operator is linear in four totals of the step (`StepShape`), so `RooflineModel` computes its
coefficients once per model and then costs any step with a few multiplications (the engine does
it for every step it runs).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from engine.models.config import ModelArch

OPERATORS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "attention")


class StepShape(NamedTuple):
    """The totals of one step that its cost depends on."""

    num_tokens: int  # query rows: every layer GEMM runs on these
    num_sampled: int  # rows through the LM head
    attention_pairs: int  # (query row, key) pairs, summed over the sequences
    context_tokens: int  # context lengths summed: the K/V tokens that cross memory

    @classmethod
    def of_sequences(cls, sequences: Iterable[tuple[int, int]], num_sampled: int | None = None) -> StepShape:
        """A (mixed prefill/decode) step from per-sequence (query_len, context_len); every sequence
        samples one row unless `num_sampled` says otherwise."""
        num_tokens = pairs = context = num_sequences = 0
        for query_len, context_len in sequences:
            if not 0 < query_len <= context_len:
                raise ValueError(f"need 0 < query_len <= context_len, got ({query_len}, {context_len})")
            num_sequences += 1
            num_tokens += query_len
            context += context_len
            # row i of the chunk sits at position context_len - query_len + i and sees that many keys + 1
            pairs += query_len * context_len - query_len * (query_len - 1) // 2
        return cls(num_tokens, num_sequences if num_sampled is None else num_sampled, pairs, context)

    @classmethod
    def decode(cls, batch: int, context: int) -> StepShape:
        """`batch` sequences decoding one token each, every one reading `context` keys."""
        return cls(batch, batch, batch * context, batch * context)


class OperatorCost(NamedTuple):
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0


NOT_RUN = OperatorCost(0.0, 0.0)  # a GEMM with no rows is not launched: no weights read either


class _Gemm(NamedTuple):  # over every layer it runs in
    flops_per_row: float
    weight_bytes: float
    activation_bytes_per_row: float


def _gemm(k: int, n: int, times: int, weight_bytes: float, activation_bytes: float) -> _Gemm:
    return _Gemm(2 * k * n * times, k * n * weight_bytes * times, (k + n) * activation_bytes * times)


class RooflineModel:
    """Per-operator FLOPs and bytes of any step of one model; bytes per element as stored
    (weight_bytes 2 for bf16, 1 for fp8/int8, 0.5 for 4-bit; kv_bytes the KV cache's)."""

    def __init__(self, arch: ModelArch, weight_bytes: float = 2, kv_bytes: float = 2, activation_bytes: float = 2):
        d, layers, head_dim = arch.hidden_size, arch.num_layers, arch.head_dim
        q_width, kv_width = arch.num_heads * head_dim, arch.num_kv_heads * head_dim
        shapes = {"qkv_proj": (d, q_width + 2 * kv_width), "o_proj": (q_width, d),
                  "gate_up_proj": (d, 2 * arch.intermediate_size), "down_proj": (arch.intermediate_size, d)}
        self.layer_gemms = {name: _gemm(k, n, layers, weight_bytes, activation_bytes)
                            for name, (k, n) in shapes.items()}
        self.lm_head = _gemm(d, arch.vocab_size, 1, weight_bytes, activation_bytes)
        self.attention_flops_per_pair = 4 * q_width * layers
        self.kv_bytes_per_token = 2 * kv_width * kv_bytes * layers  # K and V, every layer

    def costs(self, shape: StepShape) -> dict[str, OperatorCost]:
        """Operator -> its FLOPs and bytes in this step, in the order of OPERATORS."""
        # (written out rather than through helper calls: the engine costs every step it runs)
        tokens, sampled = shape.num_tokens, shape.num_sampled
        out = {name: OperatorCost(flops * tokens, weights + per_row * tokens) if tokens else NOT_RUN
               for name, (flops, weights, per_row) in self.layer_gemms.items()}
        flops, weights, per_row = self.lm_head
        out["lm_head"] = OperatorCost(flops * sampled, weights + per_row * sampled) if sampled else NOT_RUN
        out["attention"] = OperatorCost(self.attention_flops_per_pair * shape.attention_pairs,
                                        self.kv_bytes_per_token * shape.context_tokens)
        return out
