"""Check a request before it reaches the scheduler; InvalidRequest names the field to blame.

The engine runs these checks itself (the in-process `LLM` has no one in front of it), and the
server and the tokenizer worker run the same ones earlier, so bad input becomes a 400 and
never reaches the engine process.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from common.errors import InvalidRequest
from common.messages import SamplingParams

MAX_LOGPROBS = 20  # OpenAI's cap on top_logprobs


def validate_sampling_params(p: SamplingParams, vocab_size: int) -> None:
    def require(ok: bool, param: str, message: str):
        if not ok:
            raise InvalidRequest(param, message)

    def finite(param: str, value: float):
        require(isinstance(value, (int, float)) and math.isfinite(value), param,
                f"must be a finite number, got {value!r}")

    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        finite(name, getattr(p, name))
    require(p.n >= 1, "n", f"must be at least 1, got {p.n}")
    require(0 <= p.temperature <= 2, "temperature", f"must be in [0, 2], got {p.temperature}")
    require(0 < p.top_p <= 1, "top_p", f"must be in (0, 1], got {p.top_p}")
    require(p.top_k == -1 or p.top_k >= 0, "top_k", f"must be -1, 0 (off) or positive, got {p.top_k}")
    require(0 <= p.min_p <= 1, "min_p", f"must be in [0, 1], got {p.min_p}")
    require(0 < p.repetition_penalty <= 2, "repetition_penalty", f"must be in (0, 2], got {p.repetition_penalty}")
    require(-2 <= p.presence_penalty <= 2, "presence_penalty", f"must be in [-2, 2], got {p.presence_penalty}")
    require(-2 <= p.frequency_penalty <= 2, "frequency_penalty", f"must be in [-2, 2], got {p.frequency_penalty}")
    require(p.max_tokens is None or p.max_tokens >= 1, "max_tokens", f"must be at least 1, got {p.max_tokens}")
    require(p.min_tokens >= 0, "min_tokens", f"must be non-negative, got {p.min_tokens}")
    require(p.max_tokens is None or p.min_tokens <= p.max_tokens, "min_tokens",
            f"must not exceed max_tokens ({p.min_tokens} > {p.max_tokens})")
    require(p.structured_outputs is None or p.min_tokens == 0, "min_tokens",
            "cannot be combined with structured outputs (its ban on stop tokens could leave the grammar no token)")
    require(p.logprobs is None or 0 <= p.logprobs <= MAX_LOGPROBS, "logprobs",
            f"must be in [0, {MAX_LOGPROBS}], got {p.logprobs}")
    require(p.prompt_logprobs is None or 0 <= p.prompt_logprobs <= MAX_LOGPROBS, "prompt_logprobs",
            f"must be in [0, {MAX_LOGPROBS}], got {p.prompt_logprobs}")
    require(p.seed is None or -(2**63) <= p.seed < 2**64, "seed", f"out of range: {p.seed}")
    check_token_ids("stop_token_ids", p.stop_token_ids, vocab_size)
    check_token_ids("logit_bias", list(p.logit_bias or {}), vocab_size)
    for t, bias in (p.logit_bias or {}).items():
        finite("logit_bias", bias)
        require(-100 <= bias <= 100, "logit_bias", f"bias for token {t} must be in [-100, 100], got {bias}")


def check_token_ids(param: str, token_ids: Sequence[int], vocab_size: int) -> None:
    """Every id is in [0, vocab_size). Also what keeps ids beyond 64 bits out of msgpack."""
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(param, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def resolve_max_tokens(prompt_token_ids: Sequence[int], vocab_size: int, max_tokens: int | None,
                       max_model_len: int, param: str = "prompt") -> int:
    """The max_tokens this prompt runs with (None: the rest of max_model_len).

    InvalidRequest (naming `param`, the field the prompt came from) when there is none: the
    prompt is empty, holds an id outside the vocabulary, or leaves no room for max_tokens.
    """
    if not prompt_token_ids:
        raise InvalidRequest(param, "must contain at least one token")
    check_token_ids(param, prompt_token_ids, vocab_size)
    n = len(prompt_token_ids)
    if max_tokens is None:
        if n >= max_model_len:
            raise InvalidRequest(param, f"{n} tokens leave no room in max_model_len {max_model_len}")
        return max_model_len - n
    if n + max_tokens > max_model_len:
        raise InvalidRequest(param, f"the prompt ({n} tokens) plus max_tokens ({max_tokens}) = {n + max_tokens} "
                                    f"exceeds max_model_len {max_model_len}")
    return max_tokens


