"""Check a request's SamplingParams before it reaches the scheduler; ValueError names the field."""
from __future__ import annotations

import math

from common.messages import SamplingParams

MAX_LOGPROBS = 20  # OpenAI's cap on top_logprobs


def validate_sampling_params(p: SamplingParams, vocab_size: int) -> None:
    def require(ok: bool, field: str, message: str):
        if not ok:
            raise ValueError(f"{field}: {message}")

    def finite(field: str, value: float):
        require(isinstance(value, (int, float)) and math.isfinite(value), field, f"must be a finite number, got {value!r}")

    for field in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        finite(field, getattr(p, field))
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
    require(p.logprobs is None or 0 <= p.logprobs <= MAX_LOGPROBS, "logprobs",
            f"must be in [0, {MAX_LOGPROBS}], got {p.logprobs}")
    require(p.seed is None or -(2**63) <= p.seed < 2**64, "seed", f"out of range: {p.seed}")
    for t in p.stop_token_ids:
        require(0 <= t < vocab_size, "stop_token_ids", f"token id {t} is outside the vocabulary [0, {vocab_size})")
    for t, bias in (p.logit_bias or {}).items():
        require(0 <= t < vocab_size, "logit_bias", f"token id {t} is outside the vocabulary [0, {vocab_size})")
        finite("logit_bias", bias)
        require(-100 <= bias <= 100, "logit_bias", f"bias for token {t} must be in [-100, 100], got {bias}")


def validate_prompt(prompt_token_ids: list[int], vocab_size: int, max_tokens: int | None, max_model_len: int) -> int:
    """Check the prompt and return the resolved max_tokens (None -> the rest of max_model_len)."""
    if not prompt_token_ids:
        raise ValueError("prompt: must contain at least one token")
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab_size})")
    n = len(prompt_token_ids)
    if max_tokens is None:
        if n >= max_model_len:
            raise ValueError(f"prompt: {n} tokens leave no room in max_model_len {max_model_len}")
        return max_model_len - n
    if n + max_tokens > max_model_len:
        raise ValueError(f"prompt ({n} tokens) plus max_tokens ({max_tokens}) = {n + max_tokens} "
                         f"exceeds max_model_len {max_model_len}")
    return max_tokens
